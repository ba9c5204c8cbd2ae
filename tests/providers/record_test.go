package providers

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// otherSecret is the env value of another space of fleet A: it never leaves A.
const otherSecret = "env-value-of-a-space-that-stays-home"

// sent is one request fleet A sent its provider.
type sent struct {
	method, host, path string
	header             http.Header
	body               []byte
}

func (s sent) String() string { return s.method + " " + s.host + s.path }

// recorder stands between fleet A and its provider (fleet B): it records every request A
// sends (headers and body, an export included) and passes it on to B, Host kept; one call
// can be held until the test lets it go or drops it.
type recorder struct {
	t    *testing.T
	url  string
	next *httputil.ReverseProxy

	mu   sync.Mutex
	sent []sent
	// hold, when set, names a call ("POST /api/provider/v1/spaces/<host>/resume") to hold:
	// held hears it, and the call waits for release (true: passed on, false: dropped).
	hold    string
	held    chan struct{}
	release chan bool
}

func newRecorder(t *testing.T, b *fleet, bAddr string) *recorder {
	cert, err := tls.LoadX509KeyPair(b.ca.CertFile, b.ca.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.4:0")
	if err != nil {
		t.Fatal(err)
	}
	target := &url.URL{Scheme: "https", Host: bAddr}
	r := &recorder{t: t, next: &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
		},
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: b.ca.Pool}},
	}}
	srv := httptest.NewUnstartedServer(r)
	srv.Listener = ln
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, "reading the body", http.StatusBadGateway)
		return
	}
	s := sent{method: req.Method, host: req.Host, path: req.URL.Path, header: req.Header.Clone(), body: body}
	r.mu.Lock()
	r.sent = append(r.sent, s)
	hold := r.hold != "" && r.hold == req.Method+" "+req.URL.Path
	if hold {
		r.hold = ""
	}
	r.mu.Unlock()
	if hold {
		r.held <- struct{}{}
		if !<-r.release {
			http.Error(w, "dropped by the test", http.StatusBadGateway)
			return
		}
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	r.next.ServeHTTP(w, req)
}

// holdNext holds the next call of method and path.
func (r *recorder) holdNext(method, path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hold, r.held, r.release = method+" "+path, make(chan struct{}, 1), make(chan bool, 1)
}

func (r *recorder) requests() []sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sent(nil), r.sent...)
}

// TestProviderGetsNoFleetSecret: everything fleet A sends its provider (the API calls,
// the export, the forwarded requests), recorded on the way, carries none of A's secrets
// (its mesh token, its bucket's S3 key and secret, another space's env value, the token
// it accepts exports with); the delegated space's own env value reaches the provider in
// the delegation's PUT of the space, and in nothing else. On the way, A's box is killed
// after flipping the route to the provider and before asking it to serve the space: the
// provider holds the space asleep (503), A serves nothing of it, and running delegate
// again finishes the move.
func TestProviderGetsNoFleetSecret(t *testing.T) {
	b := newFleet(t, "fleet-b", domainB, meshTokenB)
	a := newFleet(t, "fleet-a", domainA, meshTokenA)
	b.api = true
	b.lchat = map[string]any{"provider_clients": []any{
		map[string]any{"name": "fleet-a", "token": tokenAToB, "sign_token": tokenBToA, "domains": []string{domainA}},
	}}
	bAddr := b.addr("127.0.0.3")
	b1 := b.start(bAddr)
	rec := newRecorder(t, b, bAddr)
	a.lchat = map[string]any{"providers": []any{map[string]any{
		"name": "partner", "url": rec.url, "token": tokenAToB, "accept_token": tokenBToA,
		"domains": []string{domainA}, "trusted_ca_files": []string{b.ca.CAFile},
	}}}
	a1 := a.start(a.addr("127.0.0.1"))
	const room, other = "room." + domainA, "other." + domainA
	a.createSpace(a1, room)
	a1.AdminJSON(http.MethodPost, "/lchat/routes", map[string]any{"host": other, "kind": "demo",
		"env": map[string]string{"DEMO_SECRET": otherSecret}}, http.StatusCreated, nil)
	a.post(a1, room, "written at home")
	a.post(a1, other, "stays home")

	// Killed between the flip and the resume.
	rec.holdNext(http.MethodPost, "/api/provider/v1/spaces/"+room+"/resume")
	go a1.CLI("delegate", room, "--to", "partner")
	select {
	case <-rec.held:
	case <-time.After(2 * time.Minute):
		t.Fatal("the delegation never asked the provider to serve the space")
	}
	a1.Kill()
	rec.release <- false
	a1.Start()
	if rt := route(t, a1, room); rt["provider"] != "partner" || rt["provider_state"] != nil {
		t.Fatalf("the route after the box died past the flip: %v", rt)
	}
	base := "/api/provider/v1/spaces/" + room
	if code, body := apiCall(t, b, b1, tokenAToB, http.MethodGet, base); code != http.StatusOK || !strings.Contains(body, `"state": "held"`) {
		t.Fatalf("the provider's space, never asked to serve: %d %s, want it held", code, body)
	}
	if code, hdr, _ := a.do(a1, http.MethodGet, room, "/api/messages", ""); code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("the space left half-way: %d Retry-After %q, want 503 with Retry-After", code, hdr.Get("Retry-After"))
	}
	out, err := a1.CLI("delegate", room, "--to", "partner")
	if err != nil || !strings.Contains(out, "already delegated") {
		t.Fatalf("delegate again: %v\n%s", err, out)
	}
	if code, body := apiCall(t, b, b1, tokenAToB, http.MethodGet, base); code != http.StatusOK || !strings.Contains(body, `"state": "serving"`) {
		t.Fatalf("the provider's space after delegate ran again: %d %s, want it serving", code, body)
	}
	if body := a.mustDo(a1, http.MethodGet, room, "/api/messages", "", http.StatusOK); !strings.Contains(body, "written at home") {
		t.Fatalf("the delegated space through A: %.300s", body)
	}
	a.post(a1, room, "written at the partner")
	delegated := len(rec.requests())

	if out, err := a1.CLI("reclaim", room); err != nil || !strings.Contains(out, "reclaimed "+room) {
		t.Fatalf("reclaim: %v\n%s", err, out)
	}
	if body := a.mustDo(a1, http.MethodGet, room, "/api/messages", "", http.StatusOK); !strings.Contains(body, "written at the partner") {
		t.Fatalf("the reclaimed space: %.300s", body)
	}

	reqs := rec.requests()
	var withEnv []string
	var exports, imports int
	for i, s := range reqs {
		raw := fmt.Sprintf("%s %s %s\n%v\n%s", s.method, s.host, s.path, s.header, s.body)
		for what, secret := range map[string]string{"A's mesh token": meshTokenA, "A's S3 access key": a.s3.AccessKey,
			"A's S3 secret key": a.s3.SecretKey, "another space's env value": otherSecret, "the token A accepts exports with": tokenBToA} {
			if strings.Contains(raw, secret) {
				t.Errorf("%s carries %s", s, what)
			}
		}
		if strings.Contains(raw, envSecret) {
			withEnv = append(withEnv, s.String())
			if s.method != http.MethodPut || s.path != base || i >= delegated {
				t.Errorf("%s carries the space's env value: only the delegation's PUT of the space may", s)
			}
		}
		switch {
		case s.method == http.MethodPut && s.path == base+"/state":
			exports++
		case s.method == http.MethodGet && s.path == base+"/export":
			imports++
		}
	}
	if len(withEnv) != 1 || exports != 1 || imports != 1 {
		t.Fatalf("requests with the space's env value: %q (want one), exports sent %d, taken back %d (want 1 and 1); of %d requests", withEnv, exports, imports, len(reqs))
	}
	harness.WaitFor(t, 10*time.Second, "the provider's route gone", func() bool {
		code, _ := apiCall(t, b, b1, tokenAToB, http.MethodGet, base)
		return code == http.StatusNotFound
	})
}
