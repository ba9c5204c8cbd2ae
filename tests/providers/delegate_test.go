package providers

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/provider"
	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// twoFleets starts fleet B (one box on 127.0.0.3, the provider "partner", hosting for
// fleet-a and fleet-c) and fleet A (two boxes on 127.0.0.1 and .2, delegating to it).
func twoFleets(t *testing.T) (a, b *fleet) {
	b = newFleet(t, "fleet-b", domainB, meshTokenB)
	a = newFleet(t, "fleet-a", domainA, meshTokenA)
	b.api = true
	b.lchat = map[string]any{"provider_clients": []any{
		map[string]any{"name": "fleet-a", "token": tokenAToB, "sign_token": tokenBToA, "domains": []string{domainA}},
		map[string]any{"name": "fleet-c", "token": tokenCToB, "sign_token": tokenBToC, "domains": []string{domainA}},
	}}
	bAddr := b.addr("127.0.0.3")
	a.lchat = map[string]any{"providers": []any{map[string]any{
		"name": "partner", "url": "https://" + bAddr, "token": tokenAToB, "accept_token": tokenBToA,
		"domains": []string{domainA}, "trusted_ca_files": []string{b.ca.CAFile},
	}}}
	b.start(bAddr)
	a.start(a.addr("127.0.0.1"))
	a.start(a.addr("127.0.0.2"))
	return a, b
}

// TestDelegateAndReclaim: fleet A delegates a space to fleet B; clients reach it through
// both of A's boxes (HTTP, a WebSocket the room holds, an event stream A holds) and what
// they write is in B's bucket; B stopped, A answers 503 with Retry-After for that space
// only; A reclaims it with what was written on B; another client's token, and a request
// without A's marker, reach nothing of it; re-running either move changes nothing.
func TestDelegateAndReclaim(t *testing.T) {
	a, b := twoFleets(t)
	a1, a2, b1 := a.nodes[0], a.nodes[1], b.nodes[0]
	const room, own = "room." + domainA, "own." + domainA
	a.createSpace(a1, room)
	a.createSpace(a1, own)
	harness.WaitFor(t, 20*time.Second, "both rows on A's second box", func() bool {
		code, _, _ := a2.Admin(http.MethodGet, "/lchat/routes/"+own, nil)
		return code == http.StatusOK
	})
	a.post(a1, room, "written at home")
	if st := providersOf(t, a1); len(st.Providers) != 1 || st.Providers[0].Health != "unknown" || st.Providers[0].Healthy {
		t.Fatalf("A's status of a provider nothing was asked of yet: %+v, want its health unknown", st)
	}

	out, err := a1.CLI("delegate", room, "--to", "partner")
	if err != nil || !strings.Contains(out, "delegated "+room+" to partner") {
		t.Fatalf("delegate: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(out))
	if out, err := a1.CLI("delegate", room, "--to", "partner"); err != nil || !strings.Contains(out, "already delegated") {
		t.Fatalf("delegate again: %v\n%s", err, out)
	}
	harness.WaitFor(t, 20*time.Second, "A's second box forwarding the space to partner", func() bool {
		rt := route(t, a2, room)
		return rt["provider"] == "partner" && rt["provider_state"] == nil
	})

	// Served by B through either box of A, with what it had.
	for _, n := range []*node{a1, a2} {
		if body := a.mustDo(n, http.MethodGet, room, "/api/messages", "", http.StatusOK); !strings.Contains(body, "written at home") {
			t.Fatalf("via %s: the delegated space lost its messages: %.300s", n.self, body)
		}
	}
	var bst struct {
		Spaces []struct{ Host, State string } `json:"spaces"`
	}
	b1.AdminJSON(http.MethodGet, "/lchat/status", nil, http.StatusOK, &bst)
	if !strings.Contains(func() string { r, _ := json.Marshal(bst); return string(r) }(), `"Host":"`+room+`","State":"awake"`) {
		t.Fatalf("the space is not awake on B: %+v", bst)
	}

	// A WebSocket and an event stream through A's first box; a message posted through
	// its second reaches both.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "wss://"+room+"/api/ws", &websocket.DialOptions{HTTPClient: a.client(a1)})
	if err != nil {
		t.Fatalf("WebSocket through A to the delegated space: %v", err)
	}
	defer ws.CloseNow()
	events := openStream(t, ctx, a, a1, room)
	genBefore := generationIn(t, b, room)
	a.post(a2, room, "written at the partner")
	waitMessage(t, ctx, ws, "written at the partner")
	events.wait(t, "written at the partner")
	forgedEntry(t, a, b, room)
	harness.WaitFor(t, 20*time.Second, "the message in B's bucket (a checkpoint of a newer generation)", func() bool {
		return generationIn(t, b, room) > genBefore
	})

	// Trust: another client's token, no token, a request without A's marker.
	base := "/api/provider/v1/spaces/" + room
	if code, body := apiCall(t, b, b1, tokenCToB, http.MethodGet, base); code != http.StatusNotFound {
		t.Fatalf("fleet-c's token on fleet-a's space: %d %s, want 404", code, body)
	}
	if code, body := apiCall(t, b, b1, tokenCToB, http.MethodGet, base+"/export"); code != http.StatusNotFound {
		t.Fatalf("fleet-c's token exporting fleet-a's space: %d %.200s, want 404", code, body)
	}
	// Malformed calls: a clear 4xx, nothing changed.
	const other = "other." + domainA
	req, _ := http.NewRequest(http.MethodPut, "https://"+b1.addr+"/api/provider/v1/spaces/"+other, strings.NewReader(`{"kind": 7, "shell": true}`))
	req.Header.Set("Authorization", "Bearer "+tokenAToB)
	if resp, err := b.client(b1).Do(req); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a malformed PUT of a space: %v %v, want 400", err, resp)
	}
	if code, _ := apiCall(t, b, b1, tokenAToB, http.MethodGet, "/api/provider/v1/spaces/"+other); code != http.StatusNotFound {
		t.Fatalf("a malformed PUT created %s: %d", other, code)
	}
	if code, body, _ := a1.Admin(http.MethodPost, "/lchat/providers/delegate/"+own, map[string]string{"to": "nobody"}); code != http.StatusBadRequest {
		t.Fatalf("delegate to an unknown provider: %d %s, want 400", code, body)
	}
	if out, err := a1.CLI("delegate", "Not_A_Host", "--to", "partner"); err == nil || !strings.Contains(out, "lowercase") {
		t.Fatalf("delegate of a malformed host: %v\n%s", err, out)
	}
	if code, _ := apiCall(t, b, b1, "", http.MethodGet, base); code != http.StatusUnauthorized {
		t.Fatalf("no token: %d, want 401", code)
	}
	if code, body := apiCall(t, b, b1, tokenAToB, http.MethodGet, base); code != http.StatusOK || !strings.Contains(body, `"state": "serving"`) {
		t.Fatalf("fleet-a's own token: %d %s", code, body)
	}
	// Straight at B (TLS to B's own name), the space's Host, no marker or a forged one.
	for _, marker := range []string{"", "1700000000.00", strings.Repeat("0", 64)} {
		req, _ := http.NewRequest(http.MethodGet, "https://"+b1.addr+"/api/messages", nil)
		req.Host = room
		if marker != "" {
			req.Header.Set("X-Lchat-Provider-Forwarded", marker)
		}
		resp, err := b.client(b1).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("the delegated space straight at B with marker %q: %d, want 404", marker, resp.StatusCode)
		}
	}

	// A's view: the provider, its health, the space delegated to it.
	st := providersOf(t, a1)
	if len(st.Providers) != 1 || !st.Providers[0].Healthy || st.Providers[0].Health != "healthy" || len(st.Providers[0].Spaces) != 1 || st.Providers[0].Spaces[0].Host != room {
		t.Fatalf("A's status of its providers: %+v", st)
	}
	// A's metrics count the requests to partner (the moves' calls, the forwards) and
	// their latency.
	_, _, metrics := getMetrics(t, a1)
	for _, series := range []string{`lchat_provider_requests_total{provider="partner"}`, `lchat_provider_request_seconds_count{provider="partner"}`,
		`lchat_provider_request_seconds_sum{provider="partner"}`} {
		if v, ok := metricValue(metrics, series); !ok || v <= 0 {
			t.Fatalf("A's metrics: %s = %v (present %v), want it above 0", series, v, ok)
		}
	}

	// B stopped: that space alone is a 503 with Retry-After.
	ws.CloseNow()
	events.close()
	if err := b1.Stop(); err != nil {
		t.Fatalf("stopping B: %v", err)
	}
	code, hdr, body := a.do(a2, http.MethodGet, room, "/api/messages", "")
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("the delegated space with B down: %d Retry-After %q %.200s", code, hdr.Get("Retry-After"), body)
	}
	a.mustDo(a2, http.MethodGet, own, "/api/messages", "", http.StatusOK)
	if st := providersOf(t, a2); st.Providers[0].Healthy || st.Providers[0].LastError == "" {
		t.Fatalf("A's status with B down: %+v", st.Providers[0])
	}
	code, _, metrics = getMetrics(t, a2)
	if code != http.StatusOK || !strings.Contains(metrics, `lchat_provider_errors_total{provider="partner"}`) {
		t.Fatalf("no error counted for partner in A's metrics (%d)", code)
	}

	// A reclaim that cannot reach B is undone: B still serves the space, once back.
	out, err = a1.CLI("reclaim", room)
	if err == nil || !strings.Contains(out, "served by partner, as before") {
		t.Fatalf("reclaim with B down: %v\n%s", err, out)
	}
	if rt := route(t, a1, room); rt["provider"] != "partner" || rt["provider_state"] != nil {
		t.Fatalf("the failed reclaim left the route %v", rt)
	}

	// B back: reclaimed with what was written there.
	b1.Start()
	harness.WaitFor(t, 30*time.Second, "the delegated space served again through A", func() bool {
		code, _, _ := a.do(a1, http.MethodGet, room, "/api/messages", "")
		return code == http.StatusOK
	})
	out, err = a1.CLI("reclaim", room)
	if err != nil || !strings.Contains(out, "reclaimed "+room+" from partner") {
		t.Fatalf("reclaim: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(out))
	if out, err := a1.CLI("reclaim", room); err != nil || !strings.Contains(out, "nothing changed") {
		t.Fatalf("reclaim again: %v\n%s", err, out)
	}
	if rt := route(t, a1, room); rt["provider"] != nil {
		t.Fatalf("the reclaimed route still names a provider: %v", rt)
	}
	harness.WaitFor(t, 20*time.Second, "A's second box serving the space itself", func() bool {
		return route(t, a2, room)["provider"] == nil
	})
	if body := a.mustDo(a2, http.MethodGet, room, "/api/messages", "", http.StatusOK); !strings.Contains(body, "written at the partner") ||
		!strings.Contains(body, "written at home") {
		t.Fatalf("the reclaimed space lost messages: %.400s", body)
	}
	if code, _ := apiCall(t, b, b1, tokenAToB, http.MethodGet, base); code != http.StatusNotFound {
		t.Fatalf("B still hosts the reclaimed space: %d", code)
	}
}

// generationIn is host's manifest generation in f's bucket.
func generationIn(t *testing.T, f *fleet, host string) int64 {
	m, _, err := spacestore.ReadManifest(context.Background(), f.s3.NewBucket(t, f.prefix), host)
	if err != nil || m == nil {
		return 0
	}
	return m.Generation
}

type providersStatus struct {
	Providers []struct {
		Name      string `json:"name"`
		Health    string `json:"health"`
		Healthy   bool   `json:"healthy"`
		LastError string `json:"last_error"`
		Errors    uint64 `json:"errors"`
		Spaces    []struct {
			Host  string `json:"host"`
			State string `json:"state"`
		} `json:"spaces"`
	} `json:"providers"`
}

// providersOf is n's GET /lchat/status providers.
func providersOf(t *testing.T, n *node) providersStatus {
	t.Helper()
	var st struct {
		Providers providersStatus `json:"providers"`
	}
	n.AdminJSON(http.MethodGet, "/lchat/status", nil, http.StatusOK, &st)
	return st.Providers
}

func getMetrics(t *testing.T, n *node) (int, http.Header, string) {
	code, body, err := n.Admin(http.MethodGet, "/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	return code, nil, string(body)
}

// metricValue is the value of the series (name and labels, as exposed) in a metrics
// exposition.
func metricValue(metrics, series string) (float64, bool) {
	for line := range strings.SplitSeq(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// waitMessage reads ws until a message holds text.
func waitMessage(t *testing.T, ctx context.Context, ws *websocket.Conn, text string) {
	t.Helper()
	for {
		_, msg, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("waiting for %q on the WebSocket: %v", text, err)
		}
		if strings.Contains(string(msg), text) {
			return
		}
	}
}

// stream is an open event stream's lines.
type stream struct {
	lines chan string
	stop  func()
}

func openStream(t *testing.T, ctx context.Context, f *fleet, n *node, host string) *stream {
	t.Helper()
	sctx, cancel := context.WithCancel(ctx)
	req, _ := http.NewRequestWithContext(sctx, http.MethodGet, "https://"+host+"/api/events", nil)
	req.Header.Set("Accept", "text/event-stream")
	cl := f.client(n)
	cl.Timeout = 0
	cl.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: f.ca.Pool}
	resp, err := cl.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		cancel()
		t.Fatalf("event stream through %s: %v %v", n.self, err, resp)
	}
	if resp.Header.Get("Lchat-Sse") != "" {
		t.Fatal("the client got the Lchat-Sse mark")
	}
	s := &stream{lines: make(chan string, 256), stop: func() { cancel(); resp.Body.Close() }}
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
	}()
	return s
}

func (s *stream) wait(t *testing.T, text string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				t.Fatalf("the event stream ended before %q", text)
			}
			if strings.Contains(l, text) {
				return
			}
		case <-timeout:
			t.Fatalf("no event %q on the stream", text)
		}
	}
}

func (s *stream) close() { s.stop() }

// forgedEntry: a fleet's signed upgrade naming an entry box of its choosing
// (Lchat-Ws-Entry) never makes the provider's box call that address when the room sends
// to its held WebSockets (a peer of the provider's mesh would get those calls, with the
// provider's mesh token): the entry box is recorded under the fleet's name and only takes
// what is for it with its pull.
func forgedEntry(t *testing.T, a, b *fleet, room string) {
	t.Helper()
	calls := make(chan string, 16)
	rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls <- r.Method + " " + r.URL.Path
		w.WriteHeader(http.StatusNotFound)
	}))
	defer rec.Close()
	b1 := b.nodes[0]
	req, _ := http.NewRequest(http.MethodGet, "https://"+b1.addr+"/api/ws", nil)
	req.Host = room
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	req.Header.Set("Lchat-Ws-Entry", rec.URL)
	req.Header.Set("Lchat-Conn-Id", connhold.NewID())
	(&provider.Provider{Token: tokenAToB}).Mark(req.Header, room, time.Now())
	resp, err := b.client(b1).Do(req)
	if err != nil {
		t.Fatalf("a signed upgrade straight at B: %v", err)
	}
	defer resp.Body.Close()
	a.post(a.nodes[1], room, "after a forged entry")
	select {
	case c := <-calls:
		t.Fatalf("B called the entry box a fleet named: %s", c)
	default:
	}
}
