package relocate

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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// shippedBox is one box running the shipped mesh.Caddyfile, installed as
// deploy/systemd/install.sh lays it out (the Caddyfile with every snippet beside it),
// plus the test-only DNS snippets.
type shippedBox struct {
	ip, admin, self string
	httpPort, https int
	done            chan struct{}
	logFile         string
}

func startShipped(t *testing.T, ip, region string, env []string) *shippedBox {
	t.Helper()
	dir, err := os.MkdirTemp("", "shp") // short: the state dir holds Unix sockets
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	root := harness.RepoRoot()
	snippets, _ := filepath.Glob(filepath.Join(root, "caddyfiles", "*.caddy"))
	snippets = append(snippets, filepath.Join(root, "tests", "certs", "testdata", "dns-lchat_challtestsrv.caddy"),
		filepath.Join(root, "tests", "relocate", "testdata", "relocate-dns-lchat_challtestsrv.caddy"))
	for _, f := range append(snippets, filepath.Join(root, "caddyfiles", "mesh.Caddyfile")) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		if name == "mesh.Caddyfile" {
			name = "Caddyfile"
			if os.Geteuid() != 0 {
				// Isolating spaces needs root; a developer's run opts out as dev does.
				b = bytes.Replace(b, []byte("isolation on"), []byte("isolation none"), 1)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b := &shippedBox{ip: ip, httpPort: harness.FreePortNum(t), https: harness.FreePortNum(t), done: make(chan struct{}), logFile: filepath.Join(dir, "box.log")}
	b.admin = fmt.Sprintf("127.0.0.1:%d", harness.FreePortNum(t))
	b.self = fmt.Sprintf("http://%s:%d", ip, b.httpPort)
	bin := harness.IsolatedLayout(t, dir, harness.CertsBinary(t))
	cmd := exec.Command(bin, "run", "--config", filepath.Join(dir, "Caddyfile"), "--adapter", "caddyfile")
	cmd.Env = append(append(os.Environ(), env...),
		"LCHAT_MESH_SELF="+b.self, "LCHAT_MESH_REGION="+region,
		"LCHAT_STATE_DIR="+filepath.Join(dir, "state"), "LCHAT_ADMIN_LISTEN="+b.admin,
		fmt.Sprintf("LCHAT_HTTP_PORT=%d", b.httpPort), fmt.Sprintf("LCHAT_HTTPS_PORT=%d", b.https),
		"HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	logf, err := os.Create(b.logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var exitErr error
	go func() { exitErr = cmd.Wait(); logf.Close(); close(b.done) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-b.done:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-b.done
		}
		if t.Failed() {
			out, _ := os.ReadFile(b.logFile)
			lines := strings.Split(string(out), "\n")
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			t.Logf("%s log tail:\n%s", b.self, strings.Join(lines, "\n"))
		}
		if out, _ := os.ReadFile(b.logFile); strings.Contains(string(out), dnsToken) || strings.Contains(string(out), meshToken) {
			t.Errorf("%s logged a token", b.self)
		}
	})
	harness.WaitFor(t, 60*time.Second, b.self+" admin API", func() bool {
		select {
		case <-b.done:
			out, _ := os.ReadFile(b.logFile)
			t.Fatalf("%s exited during start-up (%v):\n%s", b.self, exitErr, out)
		default:
		}
		resp, err := http.Get("http://" + b.admin + "/lchat/status")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return b
}

func (b *shippedBox) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(harness.Binary(t), append(args, "--address", b.admin)...).CombinedOutput()
	return string(out), err
}

func (b *shippedBox) status(t *testing.T) map[string]any {
	t.Helper()
	resp, err := http.Get("http://" + b.admin + "/lchat/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st map[string]any
	json.NewDecoder(resp.Body).Decode(&st)
	return st
}

// httpsGet fetches https://host/path from addr, verifying the certificate against host.
func httpsGet(addr string, roots *x509.CertPool, host, path string) (int, string, error) {
	client := &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{ServerName: host, RootCAs: roots},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			},
		},
	}
	defer client.CloseIdleConnections()
	resp, err := client.Get("https://" + host + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// TestShippedMeshRelocateMoveDNS runs two boxes, ie and fi, on the shipped
// mesh.Caddyfile with nothing but environment variables: each has a plain-http SELF on a
// private (loopback) address and a wildcard certificate from pebble. A space homed in ie
// relocates to fi with --move-dns: its A record (through the DNSimple provider of
// LCHAT_DNS_PROVIDER, replayed here) points at fi's LCHAT_PUBLIC_ADDRESS. A request for
// it at ie's HTTPS is then forwarded to fi over fi's plain-http SELF, and served.
func TestShippedMeshRelocateMoveDNS(t *testing.T) {
	s3 := harness.StartS3(t)
	acme := harness.StartACME(t, meshDomain)
	roots := acme.RootPool(t)
	dns := &fakeDNSimple{records: map[int64]map[string]any{}}
	dnsSrv := httptest.NewServer(dns)
	t.Cleanup(dnsSrv.Close)

	env := append(s3.Env("shipped/"),
		"LCHAT_WILDCARD_DOMAINS="+meshDomain, "LCHAT_MESH_DOMAINS="+meshDomain, "LCHAT_MESH_TOKEN="+meshToken,
		"LCHAT_MESH_BEAT=500ms", "LCHAT_MESH_DEAD_AFTER=3s",
		"LCHAT_DNS_PROVIDER=lchat_challtestsrv", "LCHAT_DNSIMPLE_TOKEN="+dnsToken, "LCHAT_TEST_DNSIMPLE_URL="+dnsSrv.URL,
		"LCHAT_TEST_ACME_CA="+acme.Directory, "LCHAT_TEST_ACME_CA_ROOT="+acme.ServerCAFile,
		"LCHAT_TEST_CHALLSRV="+acme.ChallSrvURL, "LCHAT_TEST_RESOLVER="+acme.SOAResolver,
		"LCHAT_CERT_CACHE=s3")
	ie := startShipped(t, "127.0.0.2", "ie", append(env, "LCHAT_PUBLIC_ADDRESS=198.51.100.7"))
	fi := startShipped(t, "127.0.0.3", "fi", append(env, "LCHAT_PUBLIC_ADDRESS="+fiAddress))

	// Both boxes see each other before the route is created, so it fans out to fi.
	for _, b := range []*shippedBox{ie, fi} {
		harness.WaitFor(t, 30*time.Second, b.self+" sees both boxes", func() bool {
			out, err := b.cli(t, "fleet", "--json")
			return err == nil && strings.Contains(out, ie.self) && strings.Contains(out, fi.self)
		})
	}
	const host = "8oe." + meshDomain
	if out, err := ie.cli(t, "add-instance", host, "--kind", "demo", "--home-region", "ie"); err != nil {
		t.Fatalf("add-instance: %v\n%s", err, out)
	}
	harness.WaitFor(t, 30*time.Second, "the row on fi", func() bool {
		out, err := fi.cli(t, "routes")
		return err == nil && strings.Contains(out, host)
	})

	out, err := ie.cli(t, "relocate", host, "--to", "fi", "--move-dns")
	if err != nil {
		t.Fatalf("relocate --move-dns on the shipped config: %v\n%s", err, out)
	}
	if got := dns.a("8oe"); len(got) != 1 || got[0] != fiAddress {
		t.Fatalf("A records of 8oe after relocate: %v, want [%s] (fi's LCHAT_PUBLIC_ADDRESS)\n%s", got, fiAddress, out)
	}

	// ie's HTTPS (its pebble wildcard) forwards to fi, the owner now, over fi's plain-http
	// SELF; fi wakes the demo space.
	ieHTTPS := fmt.Sprintf("%s:%d", ie.ip, ie.https)
	var status int
	var body string
	harness.WaitFor(t, 90*time.Second, "the space through ie's HTTPS", func() bool {
		status, body, err = httpsGet(ieHTTPS, roots, host, "/")
		return err == nil && status == http.StatusOK
	})
	if !strings.Contains(strings.ToLower(body), "<html") {
		t.Fatalf("GET %s via ie: %d %.200s", host, status, body)
	}
	counter := func(b *shippedBox, name string) float64 {
		st := b.status(t)
		m, _ := st["mesh"].(map[string]any)
		c, _ := m["counters"].(map[string]any)
		v, _ := c[name].(float64)
		return v
	}
	if n := counter(ie, "forwards"); n < 1 {
		t.Errorf("ie forwarded %v requests; want the request proxied to fi", n)
	}
	if n := counter(fi, "forwarded_in"); n < 1 {
		t.Errorf("fi took %v forwarded requests over its plain-http SELF; want 1", n)
	}
	// Plain http without the marker still goes to HTTPS.
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://%s:%d/", fi.ip, fi.httpPort), nil)
	req.Host = host
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusPermanentRedirect {
		t.Errorf("plain http without the marker: %d, want 308 to https", resp.StatusCode)
	}
}
