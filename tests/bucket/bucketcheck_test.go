package bucket_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// bucketCheck runs the real `lchat-caddy bucket-check` with only env (plus PATH and
// HOME) in its environment, and returns its combined output and exit code.
func bucketCheck(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(harness.Binary(t), append([]string{"bucket-check"}, args...)...)
	home := t.TempDir()
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_DATA_HOME=" + home, "XDG_CONFIG_HOME=" + home}, env...)
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running bucket-check: %v", err)
	}
	return string(out), code
}

// assertClean fails when the bucket holds any key under prefix: the check's scratch
// keys must all be gone.
func assertClean(t *testing.T, b bucket.Bucket) {
	t.Helper()
	page, err := b.List(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Objects) != 0 {
		t.Errorf("bucket-check left %d objects behind, first %s", len(page.Objects), page.Objects[0].Key)
	}
}

// TestBucketCheckCommand drives `lchat-caddy bucket-check` as an operator would: from
// the environment the shipped Caddyfiles read, from flags, from a Caddyfile, and with
// configurations that cannot work. A passing store exits 0 with an OK verdict and one
// line per race; a check that cannot run exits 1 naming what is wrong; no output ever
// shows the secret.
func TestBucketCheckCommand(t *testing.T) {
	s3 := harness.StartS3(t)
	creds := []string{"AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3.SecretKey}

	passes := func(t *testing.T, out string, code, races int) {
		t.Helper()
		t.Log("\n" + out)
		if code != 0 {
			t.Fatalf("exit code %d, want 0", code)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if !strings.HasPrefix(lines[len(lines)-1], "OK: ") {
			t.Errorf("last line %q, want the OK verdict", lines[len(lines)-1])
		}
		if n := strings.Count(out, " ok\n"); n != races {
			t.Errorf("%d races reported ok, want %d", n, races)
		}
		if strings.Contains(out, s3.SecretKey) {
			t.Error("output shows the secret")
		}
	}

	t.Run("environment", func(t *testing.T) {
		out, code := bucketCheck(t, s3.Env("from-env"), "--racers", "8", "--rounds", "1")
		passes(t, out, code, 4)
		if !strings.Contains(out, "s3://"+s3.Bucket+"/from-env") {
			t.Errorf("output does not name the bucket and prefix from the environment")
		}
		assertClean(t, s3.NewBucket(t, "from-env"))
	})

	t.Run("flags", func(t *testing.T) {
		env := append([]string{"AWS_REGION=" + s3.Region}, creds...)
		out, code := bucketCheck(t, env, "--bucket", s3.Bucket, "--prefix", "from-flags", "--endpoint", s3.Endpoint, "--racers", "8", "--rounds", "2")
		passes(t, out, code, 8)
		assertClean(t, s3.NewBucket(t, "from-flags"))
	})

	t.Run("caddyfile", func(t *testing.T) {
		dir := t.TempDir()
		caddyfile := filepath.Join(dir, "Caddyfile")
		err := os.WriteFile(caddyfile, []byte(`{
	lchat {
		bucket s3 {
			bucket {env.LCHAT_HIBERNATE_BUCKET}
			prefix from-config
			endpoint {env.TEST_ENDPOINT}
			use_path_style
			access_key_id {env.TEST_KEY_ID}
			secret_access_key {env.TEST_SECRET}
		}
	}
}
`), 0o644)
		if err != nil {
			t.Fatal(err)
		}
		env := []string{"LCHAT_HIBERNATE_BUCKET=" + s3.Bucket, "TEST_ENDPOINT=" + s3.Endpoint, "TEST_KEY_ID=" + s3.AccessKey, "TEST_SECRET=" + s3.SecretKey}
		out, code := bucketCheck(t, env, "--config", caddyfile, "--adapter", "caddyfile", "--racers", "8", "--rounds", "1")
		passes(t, out, code, 4)
		assertClean(t, s3.NewBucket(t, "from-config"))
	})

	t.Run("file", func(t *testing.T) {
		dir := t.TempDir()
		out, code := bucketCheck(t, nil, "--bucket", "file://"+dir, "--racers", "8", "--rounds", "1")
		passes(t, out, code, 4)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Name() != ".lchat-bucket" {
				t.Errorf("bucket-check left %s in the file bucket", e.Name())
			}
		}
	})

	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
		code int
	}{
		{"no bucket", creds, nil, "LCHAT_HIBERNATE_BUCKET", 4},
		{"malformed endpoint", creds, []string{"--bucket", s3.Bucket, "--endpoint", "127.0.0.1:9"}, "endpoint must be http(s)://host[:port]", 4},
		{"malformed endpoint in the environment", append([]string{"AWS_ENDPOINT_URL_S3=127.0.0.1:9"}, creds...), []string{"--bucket", s3.Bucket}, "$AWS_ENDPOINT_URL_S3 \"127.0.0.1:9\": endpoint must be http(s)://host[:port]", 4},
		{"wrong secret", []string{"AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=wrong-" + s3.SecretKey}, []string{"--bucket", s3.Bucket, "--endpoint", s3.Endpoint}, "writing a probe object", 1},
		{"missing bucket", creds, []string{"--bucket", "no-such-bucket", "--endpoint", s3.Endpoint}, "writing a probe object", 1},
		{"missing directory", nil, []string{"--bucket", "file:///nonexistent/lchat-bucket-check"}, "does not exist (bucket-check checks an existing bucket; --create makes it)", 1},
		{"unwritable directory", nil, []string{"--bucket", "file:///proc"}, "lchat.buckets.file: root", 1},
		{"unwritable directory to create", nil, []string{"--bucket", "file:///proc/lchat-bucket-check", "--create"}, "--create: mkdir /proc/lchat-bucket-check", 1},
		{"config without a bucket", nil, []string{"--config", writeFile(t, "{\"apps\":{}}")}, "no apps.lchat.bucket", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := bucketCheck(t, tc.env, tc.args...)
			t.Log("\n" + out)
			if code != tc.code {
				t.Errorf("exit code %d, want %d", code, tc.code)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output does not contain %q", tc.want)
			}
			if strings.Contains(out, s3.SecretKey) {
				t.Error("output shows the secret")
			}
			plainError(t, out)
		})
	}
}

// plainError fails unless out ends in one plain error line: "Error: ...", no error as
// a JSON log line, no stack. (With --config, Caddy's config loader still logs which file
// it read, at info level.)
func plainError(t *testing.T, out string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "Error: ") {
		t.Errorf("the last line is %q, want one plain \"Error: ...\" line", last)
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "goroutine ") || strings.Contains(l, `"level":"error"`) {
			t.Errorf("output has a log or stack line: %q", l)
		}
	}
}

// A bucket name or URL no request could succeed with is refused before any request:
// bucket-check sends nothing to the endpoint, and does not walk the AWS credential chain
// (whose last link is the instance metadata service).
func TestBucketCheckRefusesBadBucketsBeforeAnyRequest(t *testing.T) {
	var conns atomic.Int64
	listen := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				conns.Add(1)
				c.Close()
			}
		}()
		return "http://" + ln.Addr().String()
	}
	// No credentials in the environment: a request would go to the metadata service,
	// here a listener that counts.
	env := []string{"AWS_ENDPOINT_URL_S3=" + listen(), "AWS_EC2_METADATA_SERVICE_ENDPOINT=" + listen(), "AWS_REGION=us-east-1"}
	for _, tc := range []struct {
		name   string
		bucket string
		want   string
	}{
		{"unknown URL scheme", "nope://x", `--bucket "nope://x": not a bucket name, and "nope:" is not a bucket URL scheme`},
		{"s3 URL", "s3://lchat-spaces/prod", `give the S3 bucket's name alone (lchat-spaces)`},
		{"uppercase", "Lchat", `bucket name "Lchat": must be lowercase`},
		{"underscore", "my_bucket", `bucket name "my_bucket"`},
		{"too short", "ab", `must be 3 to 63 characters long`},
		{"IP address", "192.168.1.1", `must not be an IP address`},
		{"file URL with a relative path", "file://data", `a file bucket is file:///absolute/path`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := bucketCheck(t, env, "--bucket", tc.bucket)
			if code != 4 {
				t.Errorf("exit code %d, want 4 (bad input)\n%s", code, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output %q does not contain %q", out, tc.want)
			}
			plainError(t, out)
		})
	}
	t.Run("from the environment", func(t *testing.T) {
		out, code := bucketCheck(t, append([]string{"LCHAT_HIBERNATE_BUCKET=nope://x"}, env...))
		if code != 4 || !strings.Contains(out, `$LCHAT_HIBERNATE_BUCKET "nope://x"`) {
			t.Errorf("exit code %d, output %q: want 4 naming $LCHAT_HIBERNATE_BUCKET", code, out)
		}
	})
	if n := conns.Load(); n != 0 {
		t.Errorf("bucket-check made %d connections for a bucket it should have refused", n)
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
