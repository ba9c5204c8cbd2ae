package providers

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/provider"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// hostileProvider is a provider that takes every space it is given (its API answers
// as the contract says) and then answers the spaces' requests badly, by host: garbage
// instead of HTTP, never, an endless body, or headers of the box's own.
func hostileProvider(t *testing.T, ca *harness.TestCA) string {
	cert, err := tls.LoadX509KeyPair(ca.CertFile, ca.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.4:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if host, op, ok := provider.SplitPath(r.URL.Path); ok {
			switch {
			case op == provider.OpState:
				io.Copy(io.Discard, r.Body)
				json.NewEncoder(w).Encode(provider.Imported{Generation: 1})
			case op == provider.OpSpace && r.Method == http.MethodPut:
				w.WriteHeader(http.StatusCreated)
				json.NewEncoder(w).Encode(provider.Status{Host: host, State: provider.StateHeld})
			case op == provider.OpResume:
				json.NewEncoder(w).Encode(provider.Status{Host: host, State: provider.StateServing})
			default:
				w.WriteHeader(http.StatusNoContent)
			}
			return
		}
		switch strings.SplitN(r.Host, ".", 2)[0] {
		case "garbage":
			conn, buf, _ := w.(http.Hijacker).Hijack()
			buf.WriteString("HTTP/1.1 2OO whatever\r\n\x00\x01\x02 not a header\r\n\r\n")
			buf.Flush()
			conn.Close()
		case "slow":
			<-r.Context().Done()
		case "huge":
			w.Header().Set("Content-Type", "application/octet-stream")
			chunk := make([]byte, 64<<10)
			for {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		case "headers":
			w.Header().Set("X-Lchat-Mesh-Holder", "https://169.254.169.254")
			w.Header().Set("X-Lchat-Instance", "not yours")
			io.WriteString(w, "ok")
		}
	}))
	srv.Listener = ln
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestHostileProvider: a provider that answers garbage, answers slowly, sends a huge body
// or the box's own headers costs the fleet one request each, not a box: each is a 503
// with Retry-After (or an answer cut at max_response_bytes), the box's other spaces
// answer, and the provider shows as failing. A provider whose certificate does not
// verify is never reached: delegating to it fails, and the space is served here as
// before.
func TestHostileProvider(t *testing.T) {
	a := newFleet(t, "fleet-a", domainA, meshTokenA)
	badCA := harness.NewTestCA(t, t.TempDir(), "bad.test")
	bad := hostileProvider(t, badCA)
	a.lchat = map[string]any{"providers": []any{
		map[string]any{"name": "bad", "url": bad, "token": tokenAToB, "accept_token": tokenBToA, "domains": []string{domainA},
			"trusted_ca_files":        []string{badCA.CAFile},
			"response_header_timeout": "1s", "max_response_bytes": 1 << 20},
		map[string]any{"name": "untrusted", "url": bad, "token": tokenCToB, "accept_token": tokenBToC, "domains": []string{domainA},
			"trusted_ca_files": []string{a.ca.CAFile}},
	}}
	a1 := a.start(a.addr("127.0.0.1"))
	const own = "own." + domainA
	a.createSpace(a1, own)
	for _, name := range []string{"garbage", "slow", "huge", "headers"} {
		host := name + "." + domainA
		a.createSpace(a1, host)
		if out, err := a1.CLI("delegate", host, "--to", "bad"); err != nil {
			t.Fatalf("delegate %s: %v\n%s", host, err, out)
		}
	}
	for _, host := range []string{"garbage." + domainA, "slow." + domainA} {
		code, hdr, body := a.do(a1, http.MethodGet, host, "/", "")
		if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
			t.Errorf("%s: %d Retry-After %q %.200s, want 503 with Retry-After", host, code, hdr.Get("Retry-After"), body)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, "https://huge."+domainA+"/", nil)
	resp, err := a.client(a1).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil || n > 2<<20 {
		t.Errorf("huge: read %d bytes, err %v; want the answer cut near max_response_bytes (1 MiB)", n, err)
	}
	code, hdr, body := a.do(a1, http.MethodGet, "headers."+domainA, "/", "")
	for k := range hdr {
		if strings.HasPrefix(strings.ToLower(k), "x-lchat-") {
			t.Errorf("the provider's %s reached the client", k)
		}
	}
	if code != http.StatusOK || body != "ok" {
		t.Errorf("headers: %d %q", code, body)
	}
	a.mustDo(a1, http.MethodGet, own, "/api/messages", "", http.StatusOK)
	if a1.Exited() {
		t.Fatal("the box exited")
	}
	st := providersOf(t, a1)
	found := false
	for _, p := range st.Providers {
		if p.Name == "bad" {
			found = true
			if p.Errors < 3 {
				t.Errorf("bad provider's status: %+v, want at least 3 errors", p)
			}
		}
	}
	if !found {
		t.Fatalf("no status of the bad provider: %+v", st)
	}

	// A certificate that does not chain to the provider's configured roots: never
	// reached, the delegation undone, the space served here.
	const mine = "mine." + domainA
	a.createSpace(a1, mine)
	a.post(a1, mine, "stays home")
	out, err := a1.CLI("delegate", mine, "--to", "untrusted")
	if err == nil || !strings.Contains(out, "served by this fleet") {
		t.Fatalf("delegate to a provider whose certificate does not verify: %v\n%s", err, out)
	}
	if rt := route(t, a1, mine); rt["provider"] != nil {
		t.Fatalf("the failed delegation left the route delegated: %v", rt)
	}
	if body := a.mustDo(a1, http.MethodGet, mine, "/api/messages", "", http.StatusOK); !strings.Contains(body, "stays home") {
		t.Fatalf("the space after a failed delegation: %.300s", body)
	}
}
