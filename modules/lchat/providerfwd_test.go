package lchat

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/held"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/provider"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// sleepyProvider is a provider whose space ends its event stream at once (it slept the
// space) and wakes on a POST, as a provider's box does; a held stream's reopen is served
// only while the space is awake (409 otherwise), each reported on reopens.
type sleepyProvider struct {
	mu      sync.Mutex
	awake   bool
	reopens chan bool // whether each reopen found the space awake
}

func (p *sleepyProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(provider.WireHeader, provider.WireVersion)
	if r.Method == http.MethodPost {
		p.mu.Lock()
		p.awake = true
		p.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		return
	}
	p.mu.Lock()
	awake := p.awake
	p.mu.Unlock()
	reopen := r.Header.Get(connhold.ReopenHeader) != ""
	if reopen {
		p.reopens <- awake
		if !awake {
			w.WriteHeader(http.StatusConflict)
			return
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set(connhold.SSEHeader, connhold.SSEResumable)
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush() // a stream: chunked, with no length
	if !reopen {
		fmt.Fprint(w, "id: 1\ndata: before the sleep\n\n")
		return // the provider slept the space: its stream ends
	}
	fmt.Fprint(w, "id: 2\ndata: after the wake\n\n")
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

// delegatedEntry is a box of a mesh whose space room is delegated to the provider
// "partner", served by prov (TLS), as a server for clients.
func delegatedEntry(t *testing.T, room string, prov http.Handler) *httptest.Server {
	t.Helper()
	ca := harness.NewTestCA(t, t.TempDir(), "mesh.test")
	cert, err := tls.LoadX509KeyPair(ca.CertFile, ca.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(prov)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	app, cctx := testMesh(t)
	app.Providers = []*ProviderConfig{{Name: "partner", URL: srv.URL, Domains: []string{"mesh.test"}, TrustedCAFiles: []string{ca.CAFile},
		Token: strings.Repeat("t", 40), AcceptToken: strings.Repeat("a", 40)}}
	if err := app.provisionProviders(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.prov.close)
	cs, err := held.New(held.Config{Box: app.box, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cs.Finish)
	t.Cleanup(cs.Close)
	app.conns = cs
	ctx := context.Background()
	if _, err := app.box.Create(ctx, registry.Spec{Host: room, Kind: "demo"}); err != nil {
		t.Fatal(err)
	}
	if _, err := app.box.SetDelegation(ctx, room, box.Delegation{Provider: "partner"}); err != nil {
		t.Fatal(err)
	}
	h := &Handler{RetryAfter: caddy.Duration(5 * time.Second), app: app}
	if err := h.provisionProviderProxies(cctx, -1); err != nil {
		t.Fatal(err)
	}
	entry := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
		if err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
		}
	}))
	t.Cleanup(entry.Close)
	return entry
}

// openStream opens an event stream of room through entry: its lines, until ctx ends.
func openStream(t *testing.T, ctx context.Context, entry, room string) <-chan string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, entry+"/api/events", nil)
	req.Host = room
	req.Header.Set("Accept", "text/event-stream")
	cl := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(cl.CloseIdleConnections)
	resp, err := cl.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("event stream: %v %v", err, resp)
	}
	t.Cleanup(func() { resp.Body.Close() })
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return lines
}

// waitLine reads lines until one holds text, within d.
func waitLine(t *testing.T, lines <-chan string, text string, within time.Duration) {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the held stream ended before %q", text)
			}
			if strings.Contains(l, text) {
				return
			}
		case <-timeout:
			t.Fatalf("no %q on the held stream within %v", text, within)
		}
	}
}

// TestDelegatedStreamReopensWhenTheProviderAnswers: a resumable event stream of a
// delegated space, held by the entry box after the provider slept the space, reopens as
// soon as a request of the space gets the provider's answer (the space is awake there),
// not at the held stream's next probe: the provider announces no wake.
func TestDelegatedStreamReopensWhenTheProviderAnswers(t *testing.T) {
	const room = "room.mesh.test"
	prov := &sleepyProvider{reopens: make(chan bool, 256)}
	entry := delegatedEntry(t, room, prov)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines := openStream(t, ctx, entry.URL, room)
	waitLine(t, lines, "before the sleep", 10*time.Second)
	// The entry box's first try finds the space asleep at the provider.
	select {
	case awake := <-prov.reopens:
		if awake {
			t.Fatal("the first reopen found the space awake")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the entry box never tried to reopen the stream")
	}

	post, _ := http.NewRequest(http.MethodPost, entry.URL+"/api/messages", strings.NewReader(`{"text":"hi"}`))
	post.Host = room
	presp, err := http.DefaultClient.Do(post)
	if err != nil || presp.StatusCode != http.StatusCreated {
		t.Fatalf("POST through the entry box: %v %v", err, presp)
	}
	presp.Body.Close()
	// Well inside the probe's 30 s: the reopen follows the provider's answer.
	waitLine(t, lines, "after the wake", 15*time.Second)
}

// TestDelegatedStreamsReopenAfterAWakeWithNoRequest: the streams an entry box holds of a
// delegated space whose provider woke it with no request through the fleet (a scheduled
// wake there) reopen within a few seconds, not at their 30 s probe: one of them probes
// the provider every 5 s, and its reopen answered reopens the others at once.
func TestDelegatedStreamsReopenAfterAWakeWithNoRequest(t *testing.T) {
	const room = "room.mesh.test"
	prov := &sleepyProvider{reopens: make(chan bool, 256)}
	entry := delegatedEntry(t, room, prov)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []<-chan string
	for range 5 {
		lines := openStream(t, ctx, entry.URL, room)
		waitLine(t, lines, "before the sleep", 10*time.Second)
		streams = append(streams, lines)
	}
	// The entry box's first tries (and those the next streams' answers prompted) find
	// the space asleep at the provider; then they wait.
	for n := 0; ; n++ {
		select {
		case awake := <-prov.reopens:
			if awake {
				t.Fatal("a first reopen found the space awake")
			}
			continue
		case <-time.After(2 * time.Second):
		}
		if n < 5 {
			t.Fatalf("%d reopens, want each stream's first try", n)
		}
		break
	}
	prov.mu.Lock()
	prov.awake = true // woken there, by nothing of this fleet's
	prov.mu.Unlock()
	// Well inside the 30 s probe, and before 5 streams probing in turn every 5 s.
	deadline := time.Now().Add(18 * time.Second)
	for i, lines := range streams {
		waitLine(t, lines, "after the wake", time.Until(deadline))
		t.Logf("stream %d reopened", i)
	}
}

// TestProviderRefusesAnotherHeldWireVersion: on a provider's box, a fleet's request of the
// held-connection wire (a pull, an event, a held stream's reopen) with another version
// than the box's, or none, is answered 400 naming both, before anything acts on it (an
// event marked refused: no instance saw it); the same request with the box's version
// reaches the box's decision (the space asleep: 409), its answer carrying the version.
func TestProviderRefusesAnotherHeldWireVersion(t *testing.T) {
	const room = "room.mesh.test"
	tokA := strings.Repeat("a", 40)
	app, cctx := testMesh(t)
	app.ProviderClients = []*ProviderClientConfig{{Name: "fleet-a", Token: tokA, SignToken: strings.Repeat("s", 40), Domains: []string{"mesh.test"}}}
	if err := app.provisionProviders(); err != nil {
		t.Fatal(err)
	}
	cs, err := held.New(held.Config{Box: app.box, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cs.Finish)
	t.Cleanup(cs.Close)
	app.conns = cs
	if _, err := app.box.Registry().Put(registry.Route{Host: room, Kind: "demo", Hibernate: true, HostedFor: "fleet-a"}); err != nil {
		t.Fatal(err)
	}
	h := &Handler{RetryAfter: caddy.Duration(5 * time.Second), app: app}
	if err := h.provisionProviderProxies(cctx, -1); err != nil {
		t.Fatal(err)
	}
	serve := func(method, path, version string, hdr map[string]string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "http://"+room+path, strings.NewReader(`{"conns":[]}`))
		(&provider.Provider{Token: mesh.Secret(tokA)}).Mark(r.Header, room, time.Now())
		r.Header.Set(connhold.EntryHeader, "https://a1.mesh.test")
		if version != "" {
			r.Header.Set(provider.WireHeader, version)
		}
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
		if err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err != nil {
			var he caddyhttp.HandlerError
			if !errors.As(err, &he) {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			w.Code = he.StatusCode // as Caddy's server writes it
		}
		return w
	}
	event := map[string]string{connhold.ConnIDHeader: connhold.NewID(), connhold.EventHeader: "text", connhold.SeqHeader: "1"}
	reopen := map[string]string{"Accept": "text/event-stream", connhold.ReopenHeader: "1"}
	for _, tc := range []struct {
		name, method, path, version string
		hdr                         map[string]string
	}{
		{"a pull of version 2", http.MethodPost, provider.PullPath, "2", nil},
		{"a pull of no version", http.MethodPost, provider.PullPath, "", nil},
		{"an event of version 2", http.MethodPost, connhold.EventPath, "2", event},
		{"a reopen of no version", http.MethodGet, "/api/events", "", reopen},
	} {
		w := serve(tc.method, tc.path, tc.version, tc.hdr)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), fmt.Sprintf("held-connection wire version %q", tc.version)) ||
			w.Header().Get(provider.WireHeader) != provider.WireVersion {
			t.Errorf("%s: %d %q (wire %q), want 400 naming the versions", tc.name, w.Code, w.Body.String(), w.Header().Get(provider.WireHeader))
		}
		if tc.path == connhold.EventPath && w.Header().Get(connhold.RefusedHeader) != "1" {
			t.Errorf("%s: not marked refused", tc.name)
		}
	}
	if app.box.Engine().Here(room) {
		t.Fatal("a refused request woke the space")
	}
	if w := serve(http.MethodPost, provider.PullPath, provider.WireVersion, nil); w.Code != http.StatusConflict || w.Header().Get(provider.WireHeader) != provider.WireVersion {
		t.Fatalf("a pull of this version, the space asleep: %d %q (wire %q), want 409", w.Code, w.Body.String(), w.Header().Get(provider.WireHeader))
	}
}
