package mesh

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
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

// TestAuthorizeDuringARotation: every step of the documented three-step rotation leaves
// each box accepting what every other box sends, and a token outside the lists is refused.
func TestAuthorizeDuringARotation(t *testing.T) {
	oldTok, newTok, other := Secret(NewToken()), Secret(NewToken()), Secret(NewToken())
	type box struct {
		send   Secret
		accept []Secret
	}
	steps := [][]box{
		{{oldTok, nil}, {oldTok, []Secret{newTok}}},              // step 1 rolling out
		{{oldTok, []Secret{newTok}}, {newTok, []Secret{oldTok}}}, // step 2 rolling out
		{{newTok, []Secret{oldTok}}, {newTok, nil}},              // step 3 rolling out
	}
	for i, fleet := range steps {
		for _, from := range fleet {
			for _, to := range fleet {
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				r.Header.Set("Authorization", "Bearer "+string(from.send))
				if !Authorize(r, to.send, to.accept...) {
					t.Errorf("step %d: a box sending its token was refused", i+1)
				}
			}
		}
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer "+string(other))
	if Authorize(r, oldTok, newTok) {
		t.Error("a token in neither list was accepted")
	}
}
