package lchat

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

// answer is one request's answer through a Handler (serveLogged).
type answer struct {
	*httptest.ResponseRecorder
	err    error  // ServeHTTP's: nil when the handler answered, a page included
	logged string // the reason of the refusal the handler logged with its page, if any
}

// serveLogged serves req through h on srv (nil: a server without error routes) and
// returns what the client got, the handler's error, and the refusal it logged.
func serveLogged(t *testing.T, h *Handler, req *http.Request, srv *caddyhttp.Server) answer {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	h.logger = zap.New(core)
	if srv == nil {
		srv = &caddyhttp.Server{}
	}
	w := httptest.NewRecorder()
	req = caddyhttp.PrepareRequest(req, caddy.NewReplacer(), w, srv)
	err := h.ServeHTTP(w, req, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
	a := answer{ResponseRecorder: w, err: err}
	for _, e := range logs.FilterMessage("refused").All() {
		a.logged = e.ContextMap()["error"].(string)
	}
	return a
}

// TestUnknownHostGetsAPage: a host with no route on this box gets a 404 whose page says so
// in the format the client asks for (a browser HTML, an API client JSON, curl plain
// text), escaped, never cached, naming no other host the box serves and nothing of why.
func TestUnknownHostGetsAPage(t *testing.T) {
	app := testApp(t, boxtest.Options{})
	const tenant = "tenant-a.example.com"
	if _, err := app.box.Registry().Put(registry.Route{Host: tenant, Kind: "demo", Hibernate: true}); err != nil {
		t.Fatal(err)
	}
	h := &Handler{RetryAfter: caddy.Duration(5e9), app: app}
	const host = "tenant-b.example.com"
	get := func(method, host, accept string) answer {
		t.Helper()
		req := httptest.NewRequest(method, "http://"+host+"/some/path", nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		a := serveLogged(t, h, req, nil)
		if a.err != nil || a.Code != http.StatusNotFound {
			t.Fatalf("%s %s (Accept %q) = %d, %v; want a 404 answered", method, host, accept, a.Code, a.err)
		}
		if a.Header().Get("Cache-Control") != "no-store" || a.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("Accept %q: header %v, want Cache-Control: no-store and nosniff", accept, a.Header())
		}
		if strings.Contains(a.Body.String(), tenant) || strings.Contains(a.Body.String(), "no route") {
			t.Errorf("Accept %q: page %q names another tenant or the box's reason", accept, a.Body.String())
		}
		return a
	}

	a := get("GET", host, "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")
	if ct := a.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" ||
		!strings.Contains(a.Body.String(), host+" is not a space on this server") {
		t.Errorf("browser: %s %q, want an HTML page saying %s is not a space here", ct, a.Body.String(), host)
	}
	if !strings.Contains(a.logged, "no route for host") {
		t.Errorf("logged reason %q, want the box's", a.logged)
	}

	a = get("GET", host, "application/json")
	var page struct {
		Status int    `json:"status"`
		Error  string `json:"error"`
		Code   string `json:"code"`
		Host   string `json:"host"`
	}
	if err := json.Unmarshal(a.Body.Bytes(), &page); err != nil || a.Header().Get("Content-Type") != "application/json" ||
		page.Status != 404 || page.Code != "not_a_space" || page.Host != host || page.Error != host+" is not a space on this server." {
		t.Errorf("API client: %s %q (%v), want JSON naming the host", a.Header().Get("Content-Type"), a.Body.String(), err)
	}

	a = get("GET", host, "")
	if want := "404 Not Found: " + host + " is not a space on this server.\n"; a.Body.String() != want ||
		!strings.HasPrefix(a.Header().Get("Content-Type"), "text/plain") {
		t.Errorf("curl: %q, want %q", a.Body.String(), want)
	}

	a = get("HEAD", host, "text/html")
	if a.Body.Len() != 0 || a.Header().Get("Content-Length") == "0" {
		t.Errorf("HEAD: body %q, Content-Length %q; want the page's length and no body", a.Body.String(), a.Header().Get("Content-Length"))
	}

	// A Host the server let through with characters that mean something in HTML.
	a = get("GET", "a&b'c.example.com", "text/html")
	if strings.Contains(a.Body.String(), "a&b'c") || !strings.Contains(a.Body.String(), "a&amp;b&#39;c.example.com") {
		t.Errorf("page %q does not escape the host", a.Body.String())
	}
}

// TestUnavailablePage: a 503 keeps its Retry-After and says, in each format, when to try
// again; a browser's GET page reloads itself then. The box's reason stays in its log.
func TestUnavailablePage(t *testing.T) {
	app := testApp(t, boxtest.Options{Settings: box.Settings{Kinds: map[string]engine.Kind{"other": {Name: "other", Command: "/bin/true"}}}})
	const host = "waking.example.com"
	if _, err := app.box.Registry().Put(registry.Route{Host: host, Kind: "demo", Hibernate: true}); err != nil {
		t.Fatal(err)
	}
	h := &Handler{RetryAfter: caddy.Duration(7e9), app: app}
	for _, tc := range []struct {
		method, accept string
		want           []string
		not            []string
	}{
		{"GET", "text/html", []string{`<meta http-equiv="refresh" content="7">`, host + " is not available right now", "Try again in 7 seconds"}, nil},
		{"POST", "text/html", []string{"Try again in 7 seconds"}, []string{"refresh"}},
		{"GET", "application/json", []string{`"status":503`, `"code":"unavailable"`, `"error":"` + host + ` is not available right now; try again in 7 seconds."`, `"retry_after":7`, `"host":"` + host + `"`}, nil},
		{"GET", "*/*", []string{"503 Service Unavailable: " + host + " is not available right now; try again in 7 seconds.\n"}, nil},
	} {
		req := httptest.NewRequest(tc.method, "http://"+host+"/", nil)
		req.Header.Set("Accept", tc.accept)
		a := serveLogged(t, h, req, nil)
		if a.err != nil || a.Code != http.StatusServiceUnavailable || a.Header().Get("Retry-After") != "7" {
			t.Fatalf("%s Accept %q: %d Retry-After %q, %v; want a 503 with Retry-After 7", tc.method, tc.accept, a.Code, a.Header().Get("Retry-After"), a.err)
		}
		for _, w := range tc.want {
			if !strings.Contains(a.Body.String(), w) {
				t.Errorf("%s Accept %q: page %q lacks %q", tc.method, tc.accept, a.Body.String(), w)
			}
		}
		for _, n := range append(tc.not, "kind", "configured") {
			if strings.Contains(a.Body.String(), n) {
				t.Errorf("%s Accept %q: page %q has %q", tc.method, tc.accept, a.Body.String(), n)
			}
		}
		if !strings.Contains(a.logged, "kind is not configured") {
			t.Errorf("logged reason %q, want the box's", a.logged)
		}
	}
}

// TestSiteErrorRoutesAnswerRefusals: a site with its own error routes (handle_errors)
// gets the refusal as Caddy's error, to render as it likes: no page of the box's.
func TestSiteErrorRoutesAnswerRefusals(t *testing.T) {
	h := &Handler{RetryAfter: caddy.Duration(5e9), app: testApp(t, boxtest.Options{})}
	srv := &caddyhttp.Server{Errors: &caddyhttp.HTTPErrorConfig{Routes: caddyhttp.RouteList{{}}}}
	a := serveLogged(t, h, httptest.NewRequest("GET", "http://nobody.example.com/", nil), srv)
	var he caddyhttp.HandlerError
	if !asHandlerError(a.err, &he) || he.StatusCode != http.StatusNotFound || a.Body.Len() != 0 {
		t.Fatalf("ServeHTTP = %v, body %q; want the 404 error and nothing written", a.err, a.Body.String())
	}
}

// TestReservedPathIsNotAnUnknownHost: a client's request under the box's namespace on a
// route that exists is a plain 404, not the page saying the host is unknown.
func TestReservedPathIsNotAnUnknownHost(t *testing.T) {
	app := testApp(t, boxtest.Options{Settings: box.Settings{Kinds: boxtest.InstanceKinds(t)}})
	const host = "known.example.com"
	if _, err := app.box.Registry().Put(registry.Route{Host: host, Kind: "demo", Hibernate: true}); err != nil {
		t.Fatal(err)
	}
	h := &Handler{RetryAfter: caddy.Duration(5e9), app: app}
	if err := h.provisionProxy(caddyContext(t), -1); err != nil {
		t.Fatal(err)
	}
	a := serveLogged(t, h, httptest.NewRequest("POST", "http://"+host+connhold.EventPath, nil), nil)
	var he caddyhttp.HandlerError
	if !asHandlerError(a.err, &he) || he.StatusCode != http.StatusNotFound || strings.Contains(a.Body.String(), "not a space") {
		t.Fatalf("ServeHTTP = %v, body %q; want a plain 404", a.err, a.Body.String())
	}
}

func TestPageFormatOf(t *testing.T) {
	for accept, want := range map[string]pageFormat{
		"":                  pageText,
		"*/*":               pageText,
		"text/event-stream": pageText,
		"text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8": pageHTML,
		"application/json":                        pageJSON,
		"application/json, text/plain, */*":       pageJSON, // axios
		"text/plain, application/json":            pageText,
		"text/html;q=0.5, application/json":       pageJSON,
		"text/*;q=0.3, application/json;q=0.2":    pageText,
		"text/html;q=0, */*":                      pageText,
		"application/*":                           pageJSON,
		"bogus;;, application/json":               pageJSON,
		"text/html;q=abc, application/json;q=0.1": pageJSON,
	} {
		if got := pageFormatOf(accept); got != want {
			t.Errorf("pageFormatOf(%q) = %d, want %d", accept, got, want)
		}
	}
}

// TestNoAnswerCarriesTheSSEMark: the Lchat-Sse mark an upstream sets is taken off every
// answer to a client, whatever the request asked for and whichever way it went: to a
// live upstream here, forwarded to the peer the route lives at, or arriving from a peer
// that forwarded it. It stays only on the answer to an entry box that holds the client's
// event stream (connhold.EntryHeader).
func TestNoAnswerCarriesTheSSEMark(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(connhold.SSEHeader, connhold.SSEResumable)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: x\n\n"))
	}))
	defer upstream.Close()
	app, cctx := testMesh(t)
	ms := app.box.Mesh()
	const live, livesAt = "live.mesh.test", "elsewhere.mesh.test"
	u, _ := url.Parse(upstream.URL)
	if _, err := app.box.Registry().Put(registry.Route{Host: live, Kind: "demo", Upstream: u.Host}); err != nil {
		t.Fatal(err)
	}
	if _, err := app.box.Registry().Put(mesh.RouteFromRow(mesh.RouteRow{Host: livesAt, Kind: "demo", LivesAt: upstream.URL})); err != nil {
		t.Fatal(err)
	}
	h := &Handler{RetryAfter: caddy.Duration(5e9), app: app}
	if err := h.provisionProxy(cctx, -1); err != nil {
		t.Fatal(err)
	}
	var err error
	if h.meshProxy, err = newForwardProxy(cctx, ms, -1); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		host       string
		fromPeer   bool
		entry      bool // the peer holds the client's stream
		wantMarked bool
	}{
		{name: "to a live upstream", host: live},
		{name: "forwarded to the peer it lives at", host: livesAt},
		{name: "from a peer", host: live, fromPeer: true},
		{name: "from the entry box holding the stream", host: live, fromPeer: true, entry: true, wantMarked: true},
	} {
		for _, accept := range []string{"", "text/event-stream"} {
			req := httptest.NewRequest("GET", "http://"+tc.host+"/events", nil)
			if accept != "" {
				req.Header.Set("Accept", accept)
			}
			if tc.fromPeer {
				ms.Marker().Mark(req.Header, tc.host)
			}
			if tc.entry {
				req.Header.Set(connhold.EntryHeader, "https://box-b.mesh.test")
			}
			a := serveLogged(t, h, req, nil)
			got := a.Result().Header.Get(connhold.SSEHeader)
			if a.err != nil || a.Code != 200 || (got != "") != tc.wantMarked {
				t.Errorf("%s, Accept %q: %d %v, Lchat-Sse %q; want 200, marked %v", tc.name, accept, a.Code, a.err, got, tc.wantMarked)
			}
		}
	}
}
