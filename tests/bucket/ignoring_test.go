package bucket_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// ignoringGateway is a real store (versitygw) behind a gateway that drops the
// conditional headers (If-None-Match, If-Match) of every request and signs it again:
// what a store that accepts the headers and ignores them looks like to a client.
func ignoringGateway(t *testing.T, s3 *harness.S3) (endpoint string, stripped *atomic.Int64) {
	t.Helper()
	target, err := url.Parse(s3.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	creds := aws.Credentials{AccessKeyID: s3.AccessKey, SecretAccessKey: s3.SecretKey}
	signer := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
	stripped = new(atomic.Int64)
	rp := httputil.NewSingleHostReverseProxy(target)
	direct := rp.Director
	rp.Director = func(r *http.Request) {
		direct(r)
		r.Host = target.Host
		if r.Header.Get("If-None-Match") != "" || r.Header.Get("If-Match") != "" {
			stripped.Add(1)
			r.Header.Del("If-None-Match")
			r.Header.Del("If-Match")
		}
		// Every request is signed again: for the target's host, without the headers.
		r.Header.Del("Authorization")
		hash := r.Header.Get("X-Amz-Content-Sha256")
		if err := signer.SignHTTP(r.Context(), creds, r, hash, "s3", s3.Region, time.Now().UTC()); err != nil {
			t.Errorf("re-signing: %v", err)
		}
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv.URL, stripped
}

// TestBucketCheckRefusesIgnoringStore: `lchat-caddy bucket-check` against a store that
// accepts conditional headers and ignores them exits 2 with a FAIL verdict naming the
// races that had more than one winner -- a clear refusal, never an OK.
func TestBucketCheckRefusesIgnoringStore(t *testing.T) {
	s3 := harness.StartS3(t)
	endpoint, stripped := ignoringGateway(t, s3)
	env := []string{
		"AWS_REGION=" + s3.Region, "AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3.SecretKey,
	}
	out, code := bucketCheck(t, env, "--bucket", s3.Bucket, "--prefix", "ignoring", "--endpoint", endpoint, "--racers", "8", "--rounds", "1")
	t.Log("\n" + out)
	if stripped.Load() == 0 {
		t.Fatal("the gateway saw no conditional request")
	}
	if code != 2 {
		t.Fatalf("exit code %d, want 2 (the store does not enforce conditional writes)", code)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if last := lines[len(lines)-1]; strings.HasPrefix(last, "OK") {
		t.Fatalf("verdict %q on a store that ignores conditions", last)
	}
	if !strings.Contains(out, "FAIL") {
		t.Error("no race reported FAIL")
	}
	if strings.Contains(out, s3.SecretKey) {
		t.Error("output shows the secret")
	}
}

// TestBoxRefusesIgnoringStore: lchat-caddy itself, pointed at a store that ignores
// conditional writes, refuses to start, saying why, instead of handing out leases that
// two boxes could both win; the same box on the store itself starts.
func TestBoxRefusesIgnoringStore(t *testing.T) {
	s3 := harness.StartS3(t)
	endpoint, stripped := ignoringGateway(t, s3)
	bin := harness.Binary(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"apps":{"lchat":{"bucket":{"backend":"s3","bucket":%q,"prefix":"refuse","use_path_style":true},
		"state_dir":%q,"registry":%q}}}`, s3.Bucket, filepath.Join(dir, "st"), filepath.Join(dir, "reg.db"))
	cfgFile := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(endpoint string, within time.Duration) (string, error, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "run", "--config", cfgFile)
		cmd.Env = []string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir, "PATH=" + os.Getenv("PATH"),
			"AWS_ENDPOINT_URL_S3=" + endpoint, "AWS_REGION=" + s3.Region, "AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3.SecretKey}
		out, err := cmd.CombinedOutput()
		return string(out), err, ctx.Err() != nil
	}
	out, err, timedOut := run(endpoint, time.Minute)
	t.Logf("refusal:\n%s", out)
	if err == nil || timedOut {
		t.Fatalf("started on a store that ignores conditional writes (timed out: %v):\n%s", timedOut, out)
	}
	if !strings.Contains(out, "does not enforce conditional writes") || !strings.Contains(out, "refusing to start") {
		t.Errorf("the refusal does not say why:\n%s", out)
	}
	if stripped.Load() == 0 {
		t.Error("the gateway saw no conditional request")
	}
	if strings.Contains(out, s3.SecretKey) {
		t.Error("the refusal shows the secret key")
	}
	// On the store itself the same config starts (and runs until the deadline).
	out, _, timedOut = run(s3.Endpoint, 5*time.Second)
	if !timedOut || !strings.Contains(out, "bucket enforces conditional writes") {
		t.Fatalf("did not start on versitygw itself:\n%s", out)
	}
}
