package console

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/fleetview"
)

// fakeSource is a fixed fleet of one box and two spaces; the browser test runs the real
// lchat app, this one checks the handler's own rules.
type fakeSource struct {
	hibernated []string
	actionErr  error // what every action returns
	mesh       bool  // the fleet is a mesh
}

func (f *fakeSource) Fleet(context.Context) (fleetview.Fleet, error) {
	return fleetview.Fleet{Self: "box", Mesh: f.mesh, Boxes: []fleetview.Box{
		{Self: "box", This: true, Awake: []string{"a.example.com"}, Conns: map[string]fleetview.Conns{"a.example.com": {Open: 3, Parked: 2, Streams: 1, PendingBytes: 2048}}},
		{Self: "box-2", Conns: map[string]fleetview.Conns{"a.example.com": {Open: 1, Streams: 2, PendingBytes: 1024}}},
	}}, nil
}
func (f *fakeSource) Spaces(_ context.Context, q string, limit int) ([]fleetview.Space, error) {
	var out []fleetview.Space
	for _, h := range []string{"a.example.com", "b.example.com"} {
		if fleetview.Match(h, q) {
			sp := fleetview.Space{Host: h, Hibernate: true, State: "awake"}
			if h == "a.example.com" {
				sp.Conns = &fleetview.Conns{Open: 3, Parked: 2, Streams: 1, PendingBytes: 2048}
				sp.Durability = "bucket"
				sp.Log = &fleetview.Log{Segments: 84, Waiting: 2, Lag: 3 * time.Millisecond, WaitP50: 2 * time.Millisecond, WaitP99: 8 * time.Millisecond, Failed: 1}
			}
			out = append(out, sp)
		}
	}
	return out, nil
}
func (f *fakeSource) Stats() fleetview.Stats { return fleetview.Stats{Held: 3} }
func (f *fakeSource) Stored(context.Context, string) (fleetview.Stored, bool, error) {
	return fleetview.Stored{Generation: 7, Files: 2, Size: 2048, WrittenBy: "http://box-2"}, true, nil
}
func (f *fakeSource) Subscribe(func(fleetview.Event)) func() { return func() {} }
func (f *fakeSource) Hibernate(_ context.Context, host string) error {
	if f.actionErr != nil {
		return f.actionErr
	}
	f.hibernated = append(f.hibernated, host)
	return nil
}
func (f *fakeSource) Relocate(context.Context, string, string, bool) error { return f.actionErr }
func (f *fakeSource) Remove(context.Context, string) error                 { return f.actionErr }

// newHandler is a console over src, with actions (nil: actions off).
func newHandler(src fleetview.Source, actions fleetview.Actions) *Handler {
	h := &Handler{src: src, actions: actions, PageSize: 100, logger: zap.NewNop(), syncs: new(syncCache),
		rec: &recorder{Recorder: fleetview.NewRecorder(src, nil)}}
	h.stby, _ = src.(StandbySource)
	return h
}

func serve(h *Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, nil); err != nil {
		w.Code = statusOf(err)
		w.Body.WriteString(err.Error())
	}
	return w
}

func statusOf(err error) int {
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		return he.StatusCode
	}
	return 500
}

func TestIndexWorksWithoutScriptAndSearches(t *testing.T) {
	h := newHandler(&fakeSource{}, nil)
	w := serve(h, httptest.NewRequest("GET", "/?q=b.ex", nil))
	body := w.Body.String()
	if w.Code != 200 || !strings.Contains(body, `data-host="b.example.com"`) || strings.Contains(body, `data-host="a.example.com"`) {
		t.Fatalf("search: %d\n%s", w.Code, body)
	}
	if w.Header().Get("Content-Security-Policy") == "" {
		t.Error("no Content-Security-Policy")
	}
	if w := serve(h, httptest.NewRequest("GET", "/space/a.example.com", nil)); w.Code != 200 || strings.Contains(w.Body.String(), "actions/hibernate") {
		t.Fatalf("space page with actions off: %d, offers actions: %v", w.Code, strings.Contains(w.Body.String(), "actions/hibernate"))
	}
	if w := serve(h, httptest.NewRequest("GET", "/space/a.example.com", nil)); w.Code != 200 || !strings.Contains(w.Body.String(), "<dt>Generation</dt><dd>7</dd>") || !strings.Contains(w.Body.String(), "by box-2") {
		t.Fatalf("space page without the bucket's state: %d\n%s", w.Code, w.Body.String())
	}
	if w := serve(h, httptest.NewRequest("GET", "/space/zzz.example.com", nil)); w.Code != 404 {
		t.Fatalf("unknown space: %d", w.Code)
	}
	if w := serve(h, httptest.NewRequest("GET", "/space/A.Example.COM.", nil)); w.Code != 200 || !strings.Contains(w.Body.String(), "<h1>a.example.com") {
		t.Fatalf("a space's page under its host as typed (normalized as a Host header is): %d", w.Code)
	}
	if w := serve(h, httptest.NewRequest("DELETE", "/", nil)); w.Code != 405 {
		t.Fatalf("DELETE: %d", w.Code)
	}
	if w := serve(h, httptest.NewRequest("GET", "/static/console.js", nil)); w.Code != 200 || !strings.Contains(w.Body.String(), "EventSource") {
		t.Fatalf("static js: %d", w.Code)
	}
	if w := serve(h, httptest.NewRequest("GET", "/static/index.html", nil)); w.Code != 404 {
		t.Fatalf("templates must not be served as assets: %d", w.Code)
	}
}

// The spaces table and a space's page show the connections the box holds for each space,
// its WebSockets and its event streams; the JSON has them too.
func TestHeldConnectionsShownPerSpace(t *testing.T) {
	h := newHandler(&fakeSource{}, nil)
	const a = `<td class="conns">3 WebSockets (2 parked), 1 event stream, 2.0 KiB pending</td>`
	const b = `<td class="conns">none</td>`
	if w := serve(h, httptest.NewRequest("GET", "/", nil)); w.Code != 200 || !strings.Contains(w.Body.String(), a) || !strings.Contains(w.Body.String(), b) {
		t.Fatalf("index: %d, want %q and %q\n%s", w.Code, a, b, w.Body.String())
	}
	// The space's page: this box's, and the sum over the boxes that hold its sockets.
	for _, page := range []string{
		`<dt>Held connections on this box</dt><dd class="conns">3 WebSockets (2 parked), 1 event stream, 2.0 KiB pending</dd>`,
		`<dt>Held connections in the fleet</dt><dd class="fleet-conns">4 WebSockets (2 parked), 3 event streams, 3.0 KiB pending on box, box-2</dd>`,
	} {
		if w := serve(h, httptest.NewRequest("GET", "/space/a.example.com", nil)); w.Code != 200 || !strings.Contains(w.Body.String(), page) {
			t.Fatalf("space page: %d, want %q\n%s", w.Code, page, w.Body.String())
		}
	}
	const none = `<dd class="fleet-conns">none</dd>`
	if w := serve(h, httptest.NewRequest("GET", "/space/b.example.com", nil)); w.Code != 200 || !strings.Contains(w.Body.String(), none) {
		t.Fatalf("space page of b: %d, want %q\n%s", w.Code, none, w.Body.String())
	}
	const js = `"conns":{"open":3,"parked":2,"streams":1,"pending_bytes":2048},"fleet_conns":{"open":4,"parked":2,"streams":3,"pending_bytes":3072},"held_on":["box","box-2"]`
	if w := serve(h, httptest.NewRequest("GET", "/api/spaces", nil)); w.Code != 200 || !strings.Contains(w.Body.String(), js) {
		t.Fatalf("/api/spaces: %d, want %s\n%s", w.Code, js, w.Body.String())
	}
	// The charts draw this box's held connections over time, from the samples.
	h.rec.Sample(context.Background(), time.Now().Add(-time.Minute))
	h.rec.Sample(context.Background(), time.Now())
	const chart = `<desc id="chart-held-d">held connections now 3.</desc>`
	if w := serve(h, httptest.NewRequest("GET", "/", nil)); w.Code != 200 || !strings.Contains(w.Body.String(), chart) {
		t.Fatalf("index: %d, want %q\n%s", w.Code, chart, w.Body.String())
	}
}

func postAction(h *Handler, name string, form url.Values, site string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/actions/"+name, strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if site != "" {
		r.Header.Set("Sec-Fetch-Site", site)
	}
	return serve(h, r)
}

func TestActionsAreOffConfirmedAndSameOrigin(t *testing.T) {
	src := &fakeSource{}
	off := newHandler(src, nil)
	if w := postAction(off, "hibernate", url.Values{"host": {"a.example.com"}, "confirm": {"a.example.com"}}, "same-origin"); w.Code != 404 || len(src.hibernated) != 0 {
		t.Fatalf("actions off: %d, hibernated %v", w.Code, src.hibernated)
	}
	on := newHandler(src, src)
	if w := postAction(on, "hibernate", url.Values{"host": {"a.example.com"}, "confirm": {"a.example.com"}}, "cross-site"); w.Code != 403 || len(src.hibernated) != 0 {
		t.Fatalf("cross-site: %d, hibernated %v", w.Code, src.hibernated)
	}
	w := postAction(on, "hibernate", url.Values{"host": {"a.example.com"}}, "same-origin")
	if w.Code != 200 || !strings.Contains(w.Body.String(), `name="confirm"`) || len(src.hibernated) != 0 {
		t.Fatalf("unconfirmed: %d, hibernated %v", w.Code, src.hibernated)
	}
	if w := postAction(on, "hibernate", url.Values{"host": {"a.example.com"}, "confirm": {"b.example.com"}}, "same-origin"); w.Code != 200 || len(src.hibernated) != 0 {
		t.Fatalf("confirmed with another host: %d, hibernated %v", w.Code, src.hibernated)
	}
	w = postAction(on, "hibernate", url.Values{"host": {"a.example.com"}, "confirm": {"a.example.com"}}, "same-origin")
	if w.Code != http.StatusSeeOther || len(src.hibernated) != 1 || w.Header().Get("Location") != "../space/a.example.com?done=hibernate" {
		t.Fatalf("confirmed: %d %q, hibernated %v", w.Code, w.Header().Get("Location"), src.hibernated)
	}
	if w := postAction(on, "relocate", url.Values{"host": {"a.example.com"}}, "same-origin"); w.Code != 400 {
		t.Fatalf("relocate without a region: %d", w.Code)
	}
}

// TestEventStreamResumes: a client reconnecting with Last-Event-ID gets the events it
// missed, then live ones.
func TestEventStreamResumes(t *testing.T) {
	src := &fakeSource{}
	h := newHandler(src, nil)
	for i := 0; i < 3; i++ {
		h.rec.Record(fleetview.Event{Type: "wake", Host: "a.example.com"})
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r, nil) }))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/events", nil)
	req.Header.Set("Last-Event-ID", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var ids []string
	live := false
	for sc.Scan() && len(ids) < 3 {
		line := sc.Text()
		if line == ": live" && !live {
			live = true
			h.rec.Record(fleetview.Event{Type: "sleep", Host: "a.example.com"})
		}
		if id, ok := strings.CutPrefix(line, "id: "); ok {
			ids = append(ids, id)
		}
	}
	if strings.Join(ids, ",") != "2,3,4" {
		t.Fatalf("event ids %v, want 2,3 replayed then 4 live", ids)
	}
}

// fakeDERP is a DERP app whose home region the test moves.
type fakeDERP struct{ home int }

func (d *fakeDERP) DERP() (fleetview.DERP, bool) { return fleetview.DERP{Home: d.home}, true }

// TestChartsDrawTheDERPHomeAndItsSwitches: with the derp_switch app, the charts show
// the home region over time with a mark at each switch; without it, a note says so.
func TestChartsDrawTheDERPHomeAndItsSwitches(t *testing.T) {
	src := &fakeSource{}
	h := newHandler(src, nil)
	if w := serve(h, httptest.NewRequest("GET", "/fragment/charts", nil)); !strings.Contains(w.Body.String(), "not configured") {
		t.Fatalf("charts without the DERP app:\n%s", w.Body.String())
	}
	derp := &fakeDERP{home: 1}
	h.rec = &recorder{Recorder: fleetview.NewRecorder(src, derp)}
	t0 := time.Now().Add(-2 * time.Minute)
	h.rec.Sample(context.Background(), t0)
	derp.home = 12
	h.rec.Sample(context.Background(), t0.Add(time.Minute))
	h.rec.Record(fleetview.Event{Type: fleetview.EventWake, Host: "a.example.com", Phases: &fleetview.Phases{Ready: 300 * time.Millisecond}})
	w := serve(h, httptest.NewRequest("GET", "/fragment/charts", nil))
	body := w.Body.String()
	for _, want := range []string{`id="chart-derp"`, `class="mark"`, "DERP home region now 12", `id="chart-latency"`, "1 wakes. ≤500ms: 1."} {
		if !strings.Contains(body, want) {
			t.Errorf("charts lack %q", want)
		}
	}
	if w := serve(h, httptest.NewRequest("GET", "/api/events", nil)); !strings.Contains(w.Body.String(), `"type":"derp_switch"`) {
		t.Errorf("events lack the switch: %s", w.Body.String())
	}
}

// A space's page says its durability and, for a bucket kind awake here, its log: segments,
// answers waiting and the lag, the gate's waits, and answers refused.
func TestDurabilityShownPerSpace(t *testing.T) {
	h := newHandler(&fakeSource{}, nil)
	const a = `<dd class="durability">bucket: 84 log segments, 2 answers waiting (lag 3ms), waits p50 2ms p99 8ms, <span class="bad">1 refused</span></dd>`
	if w := serve(h, httptest.NewRequest("GET", "/space/a.example.com", nil)); w.Code != 200 || !strings.Contains(w.Body.String(), a) {
		t.Fatalf("space page: %d, want %q\n%s", w.Code, a, w.Body.String())
	}
	const b = `<dd class="durability">–</dd>`
	if w := serve(h, httptest.NewRequest("GET", "/space/b.example.com", nil)); w.Code != 200 || !strings.Contains(w.Body.String(), b) {
		t.Fatalf("space page of b: %d, want %q", w.Code, b)
	}
}

// The footer says whether actions are on, as the config has them; the space's page offers
// only the actions this box can take: hibernate for a space awake here, relocate only
// with the mesh, remove always.
func TestFooterAndActionsFollowTheConfig(t *testing.T) {
	for _, tc := range []struct {
		name          string
		actions, mesh bool
		footer        string
		offered       []string
		notOffered    []string
	}{
		{name: "actions off", footer: "Read-only: actions are off in <code>lchat_console</code>.",
			notOffered: []string{"actions/hibernate", "actions/relocate", "actions/remove"}},
		{name: "actions on, no mesh", actions: true, footer: "Actions are on in <code>lchat_console</code>: each asks for confirmation first.",
			offered: []string{"actions/hibernate", "actions/remove"}, notOffered: []string{"actions/relocate"}},
		{name: "actions on, mesh", actions: true, mesh: true, footer: "Actions are on in <code>lchat_console</code>",
			offered: []string{"actions/hibernate", "actions/relocate", "actions/remove"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &fakeSource{mesh: tc.mesh}
			var actions fleetview.Actions
			if tc.actions {
				actions = src
			}
			h := newHandler(src, actions)
			for _, path := range []string{"/", "/space/a.example.com"} {
				if body := serve(h, httptest.NewRequest("GET", path, nil)).Body.String(); !strings.Contains(body, tc.footer) {
					t.Errorf("%s: footer lacks %q\n%s", path, tc.footer, body)
				}
			}
			page := serve(h, httptest.NewRequest("GET", "/space/a.example.com", nil)).Body.String()
			for _, a := range tc.offered {
				if !strings.Contains(page, `action="../`+a+`"`) {
					t.Errorf("%s not offered", a)
				}
			}
			for _, a := range tc.notOffered {
				if strings.Contains(page, a) {
					t.Errorf("%s offered", a)
				}
			}
		})
	}
}
