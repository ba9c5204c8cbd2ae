package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/registry"
)

// peerServer is a minimal peer built from the server helpers, the way the
// http.handlers.lchat_mesh_api handler uses them.
type peerServer struct {
	domains []string
	region  string
	token   Secret
	fail    atomic.Int32 // answer this many requests with 503 first

	mu   sync.Mutex
	rows map[string]RouteRow
}

func (p *peerServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !Authorize(r, p.token) {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if p.fail.Add(-1) >= 0 {
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, PathRoute):
		row, err := DecodeRow(r, 4096)
		if err == nil && !row.InScopeFor(p.domains, p.region) {
			err = &RowError{"host", "outside this box's mesh domains and region"}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p.rows[row.Host] = row
	case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, PathRoute):
		host, ok := HostFromPath(r.URL.Path)
		if !ok {
			http.Error(w, "bad host", http.StatusBadRequest)
			return
		}
		delete(p.rows, host)
	case r.Method == http.MethodGet && r.URL.Path == PathRoutes:
		var rows []RouteRow
		for _, row := range p.rows {
			rows = append(rows, row)
		}
		WriteRoutes(w, rows)
	case r.Method == http.MethodGet && r.URL.Path == PathStatus:
		fmt.Fprintf(w, `{"routes":%d}`, len(p.rows))
	default:
		http.NotFound(w, r)
	}
}

func startPeer(t *testing.T) (*peerServer, string) {
	p := &peerServer{domains: []string{"example.com"}, region: "fi", token: testToken, rows: map[string]RouteRow{}}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv.URL
}

func TestClientAgainstPeer(t *testing.T) {
	p, url := startPeer(t)
	ctx := context.Background()
	c := &Client{Token: testToken}
	row := RouteRow{Host: "A.example.com", Kind: "chat", Version: "1.2", Hibernate: true, Env: map[string]string{"ADMIN_TOKEN": "inst-secret"}}
	if err := c.PutRoute(ctx, url, row); err != nil {
		t.Fatal(err)
	}
	if err := c.PutRoute(ctx, url, RouteRow{Host: "x.other.net", Kind: "chat", Hibernate: true, HomeRegion: "fi"}); err != nil {
		t.Fatalf("a row pinned to the peer's region is in its scope: %v", err)
	}
	err := c.PutRoute(ctx, url, RouteRow{Host: "y.other.net", Kind: "chat", Hibernate: true})
	var se *StatusError
	if !errors.As(err, &se) || se.Status != http.StatusBadRequest {
		t.Fatalf("out-of-scope row: %v, want 400", err)
	}
	rows, err := c.ListRoutes(ctx, url)
	if err != nil || len(rows) != 2 {
		t.Fatalf("ListRoutes = %v, %v", rows, err)
	}
	p.mu.Lock()
	got := p.rows["a.example.com"]
	p.mu.Unlock()
	if got.Env["ADMIN_TOKEN"] != "inst-secret" || got.Version != "1.2" {
		t.Fatalf("stored row %s lost fields", got)
	}
	for i := 0; i < 2; i++ { // a tombstone is idempotent
		if err := c.DeleteRoute(ctx, url, "a.example.com", ""); err != nil {
			t.Fatal(err)
		}
	}
	st, err := c.Status(ctx, url)
	if err != nil || string(st) != `{"routes":1}` {
		t.Fatalf("Status = %s, %v", st, err)
	}
	bad := &Client{Token: "wrong"}
	if err := bad.PutRoute(ctx, url, row); !errors.As(err, &se) || se.Status != http.StatusUnauthorized {
		t.Fatalf("wrong token: %v, want 401", err)
	}
	if err != nil && strings.Contains(err.Error(), "wrong") {
		t.Fatalf("error echoes the token: %v", err)
	}
}

func TestDecodeRowRejects(t *testing.T) {
	p, url := startPeer(t)
	for _, tc := range []struct {
		name, path, body string
	}{
		{"not json", "/api/mesh/route/a.example.com", `{`},
		{"trailing", "/api/mesh/route/a.example.com", `{"host":"a.example.com","kind":"chat","hibernate":true} {}`},
		{"path mismatch", "/api/mesh/route/b.example.com", `{"host":"a.example.com","kind":"chat","hibernate":true}`},
		// A path that names no valid host must not let the body choose one.
		{"no host in path", "/api/mesh/route/", `{"host":"a.example.com","kind":"chat","hibernate":true}`},
		{"dot-dot path", "/api/mesh/route/..", `{"host":"a.example.com","kind":"chat","hibernate":true}`},
		{"escaped slash in path", "/api/mesh/route/a.example.com%2F..", `{"host":"a.example.com","kind":"chat","hibernate":true}`},
		{"unicode path", "/api/mesh/route/b%C3%BCcher.example.com", `{"host":"a.example.com","kind":"chat","hibernate":true}`},
		{"unicode host", "/api/mesh/route/b%C3%BCcher.example.com", `{"host":"bücher.example.com","kind":"chat","hibernate":true}`},
		{"dot-dot host", "/api/mesh/route/..", `{"host":"..","kind":"chat","hibernate":true}`},
		{"env name with =", "/api/mesh/route/a.example.com", `{"host":"a.example.com","kind":"chat","hibernate":true,"env":{"A=B":"c"}}`},
		{"no kind", "/api/mesh/route/a.example.com", `{"host":"a.example.com","hibernate":true}`},
		// The registry stores kinds of at most 64 characters; a longer one must not pass here.
		{"kind too long", "/api/mesh/route/a.example.com", `{"host":"a.example.com","kind":"` + strings.Repeat("k", 65) + `","hibernate":true}`},
		{"bad host", "/api/mesh/route/a..example.com", `{"host":"a..example.com","kind":"chat","hibernate":true}`},
		{"PATH env", "/api/mesh/route/a.example.com", `{"host":"a.example.com","kind":"chat","hibernate":true,"env":{"PATH":"/tmp"}}`},
		{"LD env", "/api/mesh/route/a.example.com", `{"host":"a.example.com","kind":"chat","hibernate":true,"env":{"LD_PRELOAD":"/x.so"}}`},
		{"socket env", "/api/mesh/route/a.example.com", `{"host":"a.example.com","kind":"chat","hibernate":true,"env":{"LCHAT_SOCKET":"/x"}}`},
		{"live without lives_at", "/api/mesh/route/a.example.com", `{"host":"a.example.com","kind":"chat","hibernate":false}`},
		{"hibernating with lives_at", "/api/mesh/route/a.example.com", `{"host":"a.example.com","kind":"chat","hibernate":true,"lives_at":"https://b.example.net"}`},
		{"too big", "/api/mesh/route/a.example.com", `{"host":"a.example.com","kind":"chat","hibernate":true,"env":{"X":"` + strings.Repeat("v", 5000) + `"}}`},
	} {
		req, _ := http.NewRequest(http.MethodPut, url+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", tc.name, resp.StatusCode)
		}
	}
	if len(p.rows) != 0 {
		t.Errorf("refused rows were stored: %v", p.rows)
	}
	// A live route replicates as a lives-elsewhere row; socket paths in the body are ignored.
	body := `{"host":"a.example.com","kind":"chat","hibernate":false,"lives_at":"HTTPS://B.example.net","socket":"/run/x.sock"}`
	req := httptest.NewRequest(http.MethodPut, "/api/mesh/route/a.example.com", strings.NewReader(body))
	row, err := DecodeRow(req, 0)
	if err != nil || row.LivesAt != "https://b.example.net" {
		t.Fatalf("DecodeRow = %s, %v", row, err)
	}
	if js, _ := json.Marshal(row); strings.Contains(string(js), "sock") {
		t.Fatalf("socket path survived: %s", js)
	}
}

func TestAuthorize(t *testing.T) {
	for _, tc := range []struct {
		header string
		token  Secret
		want   bool
	}{
		{"Bearer " + testToken, testToken, true},
		{"Bearer " + testToken + "x", testToken, false},
		{"bearer " + testToken, testToken, false},
		{testToken, testToken, false},
		{"", testToken, false},
		{"Bearer ", "", false},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		if got := Authorize(r, tc.token); got != tc.want {
			t.Errorf("Authorize(%q) = %v", tc.header, got)
		}
	}
}

func TestRouteRowNeverPrintsEnv(t *testing.T) {
	row := RouteRow{Host: "a.example.com", Kind: "chat", Hibernate: true, Env: map[string]string{"ADMIN_TOKEN": "inst-secret"}}
	for _, s := range []string{row.String(), fmt.Sprintf("%v %+v %#v", row, row, row)} {
		if strings.Contains(s, "inst-secret") || !strings.Contains(s, "ADMIN_TOKEN") {
			t.Fatalf("row printed as %s", s)
		}
	}
	row.Env["BAD NAME"] = "inst-secret"
	if err := row.Validate(); err == nil || strings.Contains(err.Error(), "inst-secret") {
		t.Fatalf("Validate = %v", err)
	}
}

func TestFanout(t *testing.T) {
	p1, u1 := startPeer(t)
	p2, u2 := startPeer(t)
	p2.fail.Store(1) // the first attempt on p2 gets a 503 and is retried
	_, u3 := startPeer(t)
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()

	c := &Client{Token: testToken, RetryDelay: time.Millisecond}
	row := RouteRow{Host: "a.example.com", Kind: "chat", Hibernate: true}
	targets := []Member{{Self: u1}, {Self: u2}, {Self: deadURL}}
	start := time.Now()
	res := c.Fanout(context.Background(), row, targets)
	if time.Since(start) > 50*time.Millisecond {
		t.Fatal("Fanout blocked its caller")
	}
	errs := map[string]error{}
	for r := range res {
		errs[r.Peer] = r.Err
	}
	if len(errs) != 3 || errs[u1] != nil || errs[u2] != nil || errs[deadURL] == nil {
		t.Fatalf("results %v", errs)
	}
	for _, p := range []*peerServer{p1, p2} {
		p.mu.Lock()
		_, ok := p.rows["a.example.com"]
		p.mu.Unlock()
		if !ok {
			t.Fatal("row missing on a reachable peer")
		}
	}
	for r := range c.FanoutDelete(context.Background(), "a.example.com", "", []Member{{Self: u1}, {Self: u3}}) {
		if r.Err != nil {
			t.Fatalf("tombstone on %s: %v", r.Peer, r.Err)
		}
	}
	p1.mu.Lock()
	n := len(p1.rows)
	p1.mu.Unlock()
	if n != 0 {
		t.Fatal("tombstone did not remove the row")
	}
	// No targets: the channel closes at once.
	if _, ok := <-c.Fanout(context.Background(), row, nil); ok {
		t.Fatal("result with no targets")
	}
}

func TestTargets(t *testing.T) {
	ms := []Member{
		{Self: "https://me.example.net", Domains: []string{"example.com"}, Region: "ie"},
		{Self: "https://b.example.net", Domains: []string{"example.com"}, Region: "ie"},
		{Self: "https://c.example.net", Domains: []string{"other.org"}, Region: "fi"},
		{Self: "https://d.example.net", Domains: []string{"other.org"}, Region: "ie"},
	}
	for _, tc := range []struct {
		host, region string
		want         []string
	}{
		{"a.example.com", "", []string{"https://b.example.net"}},
		{"a.example.com", "fi", []string{"https://b.example.net", "https://c.example.net"}},
		{"a.other.org", "", []string{"https://c.example.net", "https://d.example.net"}},
		{"a.nowhere.net", "ie", []string{"https://b.example.net", "https://d.example.net"}},
		{"a.nowhere.net", "", nil},
	} {
		if got := selves(Targets(tc.host, tc.region, ms, "https://me.example.net")); !sameStrings(got, tc.want) {
			t.Errorf("Targets(%s, %q) = %v, want %v", tc.host, tc.region, got, tc.want)
		}
	}
	// A draining member gets no rows: it is shutting down.
	ms[1].Draining = true
	if got := selves(Targets("a.example.com", "fi", ms, "https://me.example.net")); !sameStrings(got, []string{"https://c.example.net"}) {
		t.Errorf("Targets with b draining = %v, want only c", got)
	}
}

// The Replicator sends a changed row to the live peers that cover its host (never to
// this box or a draining one) and a tombstone likewise, in the background, and counts
// the targets tried and failed.
func TestReplicator(t *testing.T) {
	p1, u1 := startPeer(t)
	p2, u2 := startPeer(t)
	p2.fail.Store(100) // every attempt fails
	_, u3 := startPeer(t)
	members := []Member{{Self: "https://self.example.com", Domains: []string{"example.com"}},
		{Self: u1, Domains: []string{"example.com"}}, {Self: u2, Domains: []string{"example.com"}},
		{Self: u3, Domains: []string{"example.com"}, Draining: true}}
	box := &Box{Self: "https://self.example.com", Domains: []string{"example.com"}, Live: func() []Member { return members }}
	r := &Replicator{Box: box, Client: &Client{Token: testToken, RetryDelay: time.Millisecond}, Ctx: t.Context()}
	r.Put(registry.Route{Host: "a.example.com", Kind: "chat", Hibernate: true})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, _ := r.Counts(); n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("fan-out results never counted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n, failed := r.Counts(); n != 2 || failed != 1 {
		t.Errorf("counts %d tried, %d failed; want 2 and 1 (the draining peer is left out)", n, failed)
	}
	p1.mu.Lock()
	_, ok := p1.rows["a.example.com"]
	p1.mu.Unlock()
	if !ok {
		t.Error("the row did not reach the live peer")
	}
}
