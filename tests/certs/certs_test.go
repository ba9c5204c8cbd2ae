// Package certs holds the certificate end-to-end tests: real lchat-caddy processes
// obtain a wildcard certificate from pebble through DNS-01 and share it, and the
// ACME locks, through caddy.storage.lchat on a versitygw bucket.
package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// testBinary builds ./tests/certs/cmd (Caddy + our certificate modules + the
// test-only challtestsrv DNS provider) once per test process.
func testBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir := os.Getenv("LCHAT_TEST_BIN")
		if dir == "" {
			dir = filepath.Join(harness.RepoRoot(), "bin")
		}
		binPath = filepath.Join(dir, "lchat-caddy-certs")
		cmd := exec.Command("go", "build", "-o", binPath, "./tests/certs/cmd")
		cmd.Dir = harness.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building the certs test binary: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

type boxOpts struct {
	name             string
	prefix           string // bucket prefix of the fleet
	lockTTL          time.Duration
	propagationDelay time.Duration // holds the ACME lock this long mid-order
}

type box struct {
	name    string
	addr    string // HTTPS listener, 127.0.0.1:port
	logFile string
	cmd     *exec.Cmd
	done    chan struct{}
}

// startBox runs one lchat-caddy process serving *.mesh.test over HTTPS with a
// certificate from pebble, its certificate storage in the fleet's bucket.
func startBox(t *testing.T, acme *harness.ACME, s3 *harness.S3, o boxOpts) *box {
	t.Helper()
	bin := testBinary(t)
	dir := t.TempDir()
	httpsPort, httpPort := harness.FreePortNum(t), harness.FreePortNum(t)
	b := &box{name: o.name, addr: fmt.Sprintf("127.0.0.1:%d", httpsPort), logFile: filepath.Join(dir, o.name+".log"), done: make(chan struct{})}
	dnsChallenge := map[string]any{
		"provider":            map[string]any{"name": "lchat_challtestsrv", "management_url": acme.ChallSrvURL},
		"resolvers":           []string{acme.SOAResolver},
		"propagation_timeout": -1,
	}
	if o.propagationDelay > 0 {
		dnsChallenge["propagation_delay"] = o.propagationDelay.String()
	}
	cfg := map[string]any{
		"admin":   map[string]any{"listen": fmt.Sprintf("127.0.0.1:%d", harness.FreePortNum(t))},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "DEBUG"}}},
		"storage": map[string]any{
			"module": "lchat",
			"bucket": map[string]any{
				"backend": "s3", "bucket": s3.Bucket, "prefix": o.prefix, "region": s3.Region, "endpoint": s3.Endpoint, "use_path_style": true,
				"access_key_id": "{env.AWS_ACCESS_KEY_ID}", "secret_access_key": "{env.AWS_SECRET_ACCESS_KEY}",
			},
			"lock_ttl":     o.lockTTL.String(),
			"lock_refresh": (o.lockTTL / 3).String(),
			"lock_poll":    "200ms",
		},
		"apps": map[string]any{
			"http": map[string]any{
				"http_port":  httpPort,
				"https_port": httpsPort,
				"servers": map[string]any{"mesh": map[string]any{
					"listen": []string{b.addr},
					"routes": []any{map[string]any{
						"match":  []any{map[string]any{"host": []string{"*.mesh.test"}}},
						"handle": []any{map[string]any{"handler": "static_response", "body": "served by " + o.name}},
					}},
					"automatic_https": map[string]any{"disable_redirects": true},
				}},
			},
			"tls": map[string]any{"automation": map[string]any{"policies": []any{map[string]any{
				"subjects": []string{"*.mesh.test"},
				"issuers": []any{map[string]any{
					"module":                  "acme",
					"ca":                      acme.Directory,
					"trusted_roots_pem_files": []string{acme.ServerCAFile},
					"challenges": map[string]any{
						"http":     map[string]any{"disabled": true},
						"tls-alpn": map[string]any{"disabled": true},
						"dns":      dnsChallenge,
					},
				}},
				"disable_ocsp_stapling": true,
			}}}},
		},
	}
	raw, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfgFile, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(b.logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	b.cmd = exec.Command(bin, "run", "--config", cfgFile)
	b.cmd.Env = append(append(os.Environ(), s3.Env(o.prefix)...), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	b.cmd.Stdout, b.cmd.Stderr = logf, logf
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { b.cmd.Wait(); close(b.done) }()
	t.Cleanup(func() {
		b.kill()
		if t.Failed() {
			out, _ := os.ReadFile(b.logFile)
			lines := strings.Split(string(out), "\n")
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			t.Logf("%s log tail:\n%s", b.name, strings.Join(lines, "\n"))
		}
	})
	return b
}

// kill ends the box with SIGKILL: no shutdown, no lock release.
func (b *box) kill() {
	select {
	case <-b.done:
		return
	default:
	}
	syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
	<-b.done
}

func (b *box) log(t *testing.T) string {
	out, err := os.ReadFile(b.logFile)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// get makes an HTTPS request to host on the box, trusting only roots, and returns
// the body and the leaf certificate the box presented.
func (b *box) get(roots *x509.CertPool, host string) (string, *x509.Certificate, error) {
	client := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{ServerName: host, RootCAs: roots},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, b.addr)
			},
		},
	}
	defer client.CloseIdleConnections()
	resp, err := client.Get("https://" + host + "/")
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), resp.TLS.PeerCertificates[0], err
}

// waitServing waits until the box completes verified TLS handshakes for each host.
func (b *box) waitServing(t *testing.T, roots *x509.CertPool, timeout time.Duration, hosts ...string) *x509.Certificate {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var leaf *x509.Certificate
	for _, host := range hosts {
		var err error
		harness.WaitFor(t, time.Until(deadline), fmt.Sprintf("%s to serve %s with a certificate from pebble", b.name, host), func() bool {
			var body string
			var cert *x509.Certificate
			if body, cert, err = b.get(roots, host); err == nil {
				if want := "served by " + b.name; body != want {
					t.Fatalf("%s answered %q for %s, want %q", b.name, body, host, want)
				}
				leaf = cert
				return true
			}
			select {
			case <-b.done:
				t.Fatalf("%s exited before serving %s", b.name, host)
			default:
			}
			return false
		}, func() string { return fmt.Sprintf("last error: %v", err) })
	}
	return leaf
}

// The first box obtains *.mesh.test through DNS-01 and serves it for any host
// under it; a second box on the same bucket serves the same certificate without
// a new order.
func TestWildcardIssuedOnceAndShared(t *testing.T) {
	s3 := harness.StartS3(t)
	acme := harness.StartACME(t, "mesh.test")
	roots := acme.RootPool(t)

	box1 := startBox(t, acme, s3, boxOpts{name: "box1", prefix: "fleet", lockTTL: 30 * time.Second})
	leaf := box1.waitServing(t, roots, 90*time.Second, "a.mesh.test", "b.mesh.test")
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "*.mesh.test" {
		t.Fatalf("box1 presented a certificate for %v, want exactly *.mesh.test", leaf.DNSNames)
	}
	if n := acme.Orders(t); n != 1 {
		t.Fatalf("pebble saw %d orders for one wildcard, want 1", n)
	}
	// The certificate sits in the bucket under certs/.
	page, err := s3.NewBucket(t, "fleet").List(context.Background(), "certs/certificates/", "")
	if err != nil || len(page.Objects) == 0 {
		t.Fatalf("no certificate objects under certs/certificates/ in the bucket: %v", err)
	}

	box2 := startBox(t, acme, s3, boxOpts{name: "box2", prefix: "fleet", lockTTL: 30 * time.Second})
	leaf2 := box2.waitServing(t, roots, 60*time.Second, "a.mesh.test", "b.mesh.test")
	if !leaf2.Equal(leaf) {
		t.Fatalf("box2 serves another certificate (serial %v, box1 %v)", leaf2.SerialNumber, leaf.SerialNumber)
	}
	if n := acme.Orders(t); n != 1 {
		t.Fatalf("pebble saw %d orders after box2 started, want still 1", n)
	}
}

// Two boxes start together on an empty bucket: both want *.mesh.test at once, the
// order (held open for 2s by a propagation delay) runs once under the bucket lock,
// and the box that waited loads the result instead of ordering again.
func TestLockContentionOneOrder(t *testing.T) {
	s3 := harness.StartS3(t)
	acme := harness.StartACME(t, "mesh.test")
	roots := acme.RootPool(t)

	opts := boxOpts{prefix: "fleet", lockTTL: 30 * time.Second, propagationDelay: 2 * time.Second}
	opts.name = "box1"
	box1 := startBox(t, acme, s3, opts)
	opts.name = "box2"
	box2 := startBox(t, acme, s3, opts)
	c1 := box1.waitServing(t, roots, 90*time.Second, "a.mesh.test", "b.mesh.test")
	c2 := box2.waitServing(t, roots, 90*time.Second, "a.mesh.test", "b.mesh.test")
	if !c1.Equal(c2) {
		t.Fatal("the two boxes serve different certificates: both ordered")
	}
	if n := acme.Orders(t); n != 1 {
		t.Fatalf("pebble saw %d orders from two contending boxes, want 1", n)
	}
	// The boxes contended: one of them went for the lock while the other held it,
	// and found the certificate in storage once it got the lock.
	waited := 0
	for _, b := range []*box{box1, box2} {
		if strings.Contains(b.log(t), "certificate already exists in storage") {
			waited++
		}
	}
	if waited != 1 {
		t.Fatalf("%d boxes found the certificate in storage after waiting for the lock, want 1 (no contention happened?)", waited)
	}
	page, err := s3.NewBucket(t, "fleet").List(context.Background(), "certs/locks/", "")
	if err != nil || len(page.Objects) != 0 {
		t.Fatalf("locks left in the bucket after both boxes finished: %v %v", page.Objects, err)
	}
}

// A box killed in the middle of an order leaves its lock behind; the other box
// waits for the lock to expire (lock_ttl 3s), takes it over and obtains the
// certificate.
func TestKilledHolderLockExpires(t *testing.T) {
	s3 := harness.StartS3(t)
	acme := harness.StartACME(t, "mesh.test")
	roots := acme.RootPool(t)
	fleet := s3.NewBucket(t, "fleet")

	holder := startBox(t, acme, s3, boxOpts{name: "holder", prefix: "fleet", lockTTL: 3 * time.Second, propagationDelay: 5 * time.Minute})
	waitHolderOrdering(t, fleet, acme)
	holder.kill()

	other := startBox(t, acme, s3, boxOpts{name: "other", prefix: "fleet", lockTTL: 3 * time.Second})
	other.waitServing(t, roots, 90*time.Second, "a.mesh.test", "b.mesh.test")
	if !strings.Contains(other.log(t), "took over stale lock") {
		t.Fatal("the other box served without taking over the dead holder's lock")
	}
	if n := acme.Orders(t); n != 2 {
		t.Fatalf("pebble saw %d orders, want 2 (the dead holder's and the other box's)", n)
	}
}

// waitHolderOrdering waits until the holder has taken the issuance lock and started
// its order with pebble.
func waitHolderOrdering(t *testing.T, fleet bucket.Bucket, acme *harness.ACME) {
	t.Helper()
	var err error
	harness.WaitFor(t, 60*time.Second, "the holder to take the issuance lock and start an order", func() bool {
		var page bucket.ListPage
		page, err = fleet.List(context.Background(), "certs/locks/", "")
		return err == nil && len(page.Objects) > 0 && acme.Orders(t) == 1
	}, func() string { return fmt.Sprintf("last listing error: %v", err) })
}

// A box stopped with SIGTERM in the middle of an order releases its lock on the
// way out (its config is cleaned up first, which stops the refresh, and
// certmagic's release still deletes the lock): the other box gets the lock at
// once instead of waiting for lock_ttl (60s here) to take over a stale one.
func TestStoppedHolderReleasesLock(t *testing.T) {
	s3 := harness.StartS3(t)
	acme := harness.StartACME(t, "mesh.test")
	roots := acme.RootPool(t)
	fleet := s3.NewBucket(t, "fleet")

	holder := startBox(t, acme, s3, boxOpts{name: "holder", prefix: "fleet", lockTTL: time.Minute, propagationDelay: 5 * time.Minute})
	waitHolderOrdering(t, fleet, acme)
	syscall.Kill(-holder.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-holder.done:
	case <-time.After(30 * time.Second):
		t.Fatal("holder did not exit on SIGTERM")
	}
	page, err := fleet.List(context.Background(), "certs/locks/", "")
	if err != nil || len(page.Objects) != 0 {
		t.Fatalf("locks left in the bucket after the holder stopped: %v %v", page.Objects, err)
	}

	other := startBox(t, acme, s3, boxOpts{name: "other", prefix: "fleet", lockTTL: time.Minute})
	other.waitServing(t, roots, 50*time.Second, "a.mesh.test")
	if strings.Contains(other.log(t), "took over stale lock") {
		t.Fatal("the other box had to wait out the stopped holder's lock")
	}
}
