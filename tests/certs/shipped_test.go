package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// installShipped lays out the shipped single.Caddyfile with every shipped snippet
// beside it, as an operator installs them in /etc/lchat-caddy, plus the test-only DNS
// snippet; it returns the Caddyfile's path.
func installShipped(t *testing.T, dir string) string {
	t.Helper()
	src := filepath.Join(harness.RepoRoot(), "caddyfiles")
	files, err := filepath.Glob(filepath.Join(src, "*.caddy"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no snippet files in %s: %v", src, err)
	}
	files = append(files, filepath.Join(harness.RepoRoot(), "tests", "certs", "testdata", "dns-lchat_challtestsrv.caddy"))
	for _, f := range files {
		copyFile(t, f, filepath.Join(dir, filepath.Base(f)))
	}
	caddyfile := filepath.Join(dir, "Caddyfile")
	copyFile(t, filepath.Join(src, "single.Caddyfile"), caddyfile)
	if os.Geteuid() != 0 {
		// The shipped file isolates spaces, which needs root or the unit's capabilities;
		// a developer's run as themselves opts out as lchat-caddy dev does.
		b, _ := os.ReadFile(caddyfile)
		os.WriteFile(caddyfile, bytes.Replace(b, []byte("isolation on"), []byte("isolation none"), 1), 0o644)
	}
	return caddyfile
}

// isolatedLayout makes dir what the shipped unit makes /var/lib/lchat-caddy: a state
// directory the spaces' uids may traverse (0711), and returns a copy of bin inside it,
// so "{self}" (the isolated kind's command) is reachable whatever the checkout's path,
// with a copy of lchat-pageread beside it.
func isolatedLayout(t *testing.T, dir, bin string) string {
	t.Helper()
	for _, d := range []string{dir, filepath.Join(dir, "state")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			t.Fatal(err)
		}
		os.Chmod(d, 0o711)
	}
	for _, p := range []string{harness.PageReader(t), bin} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(p)), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, filepath.Base(bin))
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The shipped single.Caddyfile, driven only by environment variables, obtains one
// wildcard per entry of LCHAT_WILDCARD_DOMAINS by DNS-01, keeps them in the bucket
// (LCHAT_CERT_CACHE=s3), and serves spaces under both domains.
func TestShippedCaddyfileWildcards(t *testing.T) {
	s3 := harness.StartS3(t)
	acme := harness.StartACME(t, "mesh.test", "other.test")
	roots := acme.RootPool(t)
	bin := testBinary(t)

	// Short: the state directory holds the spaces' Unix sockets.
	dir, err := os.MkdirTemp("", "lcs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	caddyfile := installShipped(t, dir)
	bin = isolatedLayout(t, dir, bin)

	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "space %s", r.Host)
	}))
	t.Cleanup(upstream.Close)

	httpsPort, httpPort, adminPort := harness.FreePortNum(t), harness.FreePortNum(t), harness.FreePortNum(t)
	admin := fmt.Sprintf("127.0.0.1:%d", adminPort)
	logFile := filepath.Join(dir, "box.log")
	logf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "run", "--config", caddyfile, "--adapter", "caddyfile")
	cmd.Env = append(append(os.Environ(), s3.Env("fleet")...),
		"LCHAT_WILDCARD_DOMAINS=mesh.test,other.test",
		"LCHAT_CERT_CACHE=s3",
		"LCHAT_DNS_PROVIDER=lchat_challtestsrv",
		"LCHAT_TEST_ACME_CA="+acme.Directory,
		"LCHAT_TEST_ACME_CA_ROOT="+acme.ServerCAFile,
		"LCHAT_TEST_CHALLSRV="+acme.ChallSrvURL,
		"LCHAT_TEST_RESOLVER="+acme.SOAResolver,
		"LCHAT_STATE_DIR="+filepath.Join(dir, "state"),
		"LCHAT_ADMIN_LISTEN="+admin,
		fmt.Sprintf("LCHAT_HTTPS_PORT=%d", httpsPort),
		fmt.Sprintf("LCHAT_HTTP_PORT=%d", httpPort),
		"HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir,
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-done
			}
		}
		if t.Failed() {
			out, _ := os.ReadFile(logFile)
			lines := strings.Split(string(out), "\n")
			if len(lines) > 80 {
				lines = lines[len(lines)-80:]
			}
			t.Logf("box log tail:\n%s", strings.Join(lines, "\n"))
		}
	})

	// Register a live route under each wildcard domain through the admin API.
	deadline := time.Now().Add(30 * time.Second)
	for _, host := range []string{"a.mesh.test", "x.other.test"} {
		body, _ := json.Marshal(map[string]string{"host": host, "upstream": strings.TrimPrefix(upstream.URL, "http://")})
		var err error
		harness.WaitFor(t, time.Until(deadline), "the admin API at "+admin+" to add "+host, func() bool {
			var resp *http.Response
			if resp, err = http.Post("http://"+admin+"/lchat/routes", "application/json", bytes.NewReader(body)); err == nil {
				msg, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode/100 != 2 {
					t.Fatalf("adding %s: %s %s", host, resp.Status, msg)
				}
				return true
			}
			select {
			case <-done:
				t.Fatal("the box exited before its admin API answered")
			default:
			}
			return false
		}, func() string { return fmt.Sprintf("last error: %v", err) })
	}

	addr := fmt.Sprintf("127.0.0.1:%d", httpsPort)
	for _, c := range []struct{ host, wildcard string }{{"a.mesh.test", "*.mesh.test"}, {"x.other.test", "*.other.test"}} {
		var err error
		harness.WaitFor(t, 90*time.Second, "verified TLS to "+c.host, func() bool {
			var status int
			var body string
			var names []string
			if status, body, names, err = httpsGet(addr, roots, c.host); err == nil {
				if !slices.Equal(names, []string{c.wildcard}) {
					t.Fatalf("%s presented a certificate for %v, want exactly %s", c.host, names, c.wildcard)
				}
				if want := "space " + c.host; status != http.StatusOK || body != want {
					t.Fatalf("%s answered %d %q, want 200 %q from its upstream", c.host, status, body, want)
				}
				return true
			}
			select {
			case <-done:
				t.Fatalf("the box exited before serving %s", c.host)
			default:
			}
			return false
		}, func() string { return fmt.Sprintf("last error: %v", err) })
	}
	if n := acme.Orders(t); n != 2 {
		t.Errorf("pebble saw %d orders for two wildcards, want 2", n)
	}

	// A host under a wildcard with no route: verified TLS, then 404 from the lchat handler.
	if status, _, _, err := httpsGet(addr, roots, "nobody.mesh.test"); err != nil || status != http.StatusNotFound {
		t.Errorf("unknown host nobody.mesh.test: status %d, err %v; want 404 over verified TLS", status, err)
	}
	// A name outside the wildcards has no certificate: the handshake fails.
	if _, _, _, err := httpsGet(addr, roots, "a.elsewhere.test"); err == nil {
		t.Error("a.elsewhere.test got a verified TLS connection; no certificate covers it")
	}

	// Plain HTTP redirects to HTTPS.
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/path?q=1", httpPort), nil)
	req.Host = "a.mesh.test"
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != "https://a.mesh.test/path?q=1" {
		t.Errorf("http://a.mesh.test/path?q=1 answered %s Location %q", resp.Status, resp.Header.Get("Location"))
	}

	// LCHAT_CERT_CACHE=s3: both certificates are in the bucket under <prefix>/certs/.
	var keys []string
	fleet := s3.NewBucket(t, "fleet")
	for token := ""; ; {
		page, err := fleet.List(context.Background(), "certs/certificates/", token)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page.Objects {
			keys = append(keys, o.Key)
		}
		if token = page.NextToken; token == "" {
			break
		}
	}
	for _, w := range []string{"wildcard_.mesh.test.crt", "wildcard_.other.test.crt"} {
		if !slices.ContainsFunc(keys, func(k string) bool { return strings.HasSuffix(k, "/"+w) }) {
			t.Errorf("no %s under certs/certificates/ in the bucket: %v", w, keys)
		}
	}

	// Nothing secret reached the log.
	out, _ := os.ReadFile(logFile)
	if bytes.Contains(out, []byte(s3.SecretKey)) {
		t.Error("the box log contains the S3 secret key")
	}
}

// httpsGet makes an HTTPS request for host to addr, trusting only roots, and returns
// the status, the body and the DNS names of the certificate the server presented.
func httpsGet(addr string, roots *x509.CertPool, host string) (int, string, []string, error) {
	client := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{ServerName: host, RootCAs: roots},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			},
		},
	}
	defer client.CloseIdleConnections()
	resp, err := client.Get("https://" + host + "/")
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.TLS.PeerCertificates[0].DNSNames, err
}
