package lchat

import (
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

// secretValue is an env value no answer, error or listing may ever carry.
const secretValue = "s3cr3t-env-v4lue-never-shown"

// newSecurityApp is an app with one kind, "demo", that allows the route env DEMO_SECRET.
func newSecurityApp(t *testing.T) *App { return testApp(t, boxtest.Options{}) }

// allRoutes is the whole registry, env values included, to compare before and after.
func allRoutes(t *testing.T, reg *registry.Registry) []registry.Route {
	t.Helper()
	rts, _, err := reg.List("", 1000)
	if err != nil {
		t.Fatal(err)
	}
	return rts
}

// summaries are routes as failure messages may show them: env names only.
func summaries(rts []registry.Route) []registry.Summary {
	out := make([]registry.Summary, len(rts))
	for i := range rts {
		out[i] = rts[i].Summary()
	}
	return out
}

// adminRaw serves one admin request with a raw body.
func adminRaw(a *adminAPI, method, path, body string) (int, string) {
	w := httptest.NewRecorder()
	err := a.serve(w, httptest.NewRequest(method, "http://localhost:2019"+path, strings.NewReader(body)))
	if err != nil {
		if ae, ok := err.(caddy.APIError); ok {
			return ae.HTTPStatus, ae.Err.Error()
		}
		return 0, err.Error()
	}
	return w.Code, w.Body.String()
}

// TestAdminRefusesHostileInput: malformed or hostile admin requests get a 4xx that says
// what is wrong, change nothing, and never echo an env value; what is stored is never
// shown with its env values.
func TestAdminRefusesHostileInput(t *testing.T) {
	a := &adminAPI{appRef{newSecurityApp(t)}}
	reg := a.app.box.Registry()
	create := func(host, env string) string {
		return `{"host":"` + host + `","kind":"demo","env":` + env + `}`
	}
	okEnv := `{"DEMO_SECRET":"` + secretValue + `"}`
	for _, tc := range []struct {
		name, method, path, body string
		want                     int
	}{
		{"oversized body", "POST", "/lchat/routes", `{"host":"big.example.com","kind":"demo","version":"` + strings.Repeat("v", maxBody) + `"}`, http.StatusRequestEntityTooLarge},
		{"bad JSON", "POST", "/lchat/routes", `{"host":`, http.StatusBadRequest},
		{"not an object", "POST", "/lchat/routes", `["a.example.com"]`, http.StatusBadRequest},
		{"trailing data", "POST", "/lchat/routes", create("a.example.com", okEnv) + ` {}`, http.StatusBadRequest},
		{"a route cannot name a command", "POST", "/lchat/routes", `{"host":"a.example.com","kind":"demo","command":"/bin/sh"}`, http.StatusBadRequest},
		{"syntax error inside an env value", "POST", "/lchat/routes", `{"host":"a.example.com","kind":"demo","env":{"DEMO_SECRET":"` + secretValue + `\q"}}`, http.StatusBadRequest},
		{"dot-dot host", "POST", "/lchat/routes", create("../x", okEnv), http.StatusBadRequest},
		{"path in host", "POST", "/lchat/routes", create("a/../b.example.com", okEnv), http.StatusBadRequest},
		{"unicode host", "POST", "/lchat/routes", create("bücher.example.com", okEnv), http.StatusBadRequest},
		{"uppercase host", "POST", "/lchat/routes", create("A.example.com", okEnv), http.StatusBadRequest},
		{"host with port", "POST", "/lchat/routes", create("a.example.com:443", okEnv), http.StatusBadRequest},
		{"wildcard host", "POST", "/lchat/routes", create("*.example.com", okEnv), http.StatusBadRequest},
		{"IP host", "POST", "/lchat/routes", create("127.0.0.1", okEnv), http.StatusBadRequest},
		{"empty host", "POST", "/lchat/routes", create("", okEnv), http.StatusBadRequest},
		{"header injection in host", "POST", "/lchat/routes", create(`a.example.com\r\nX-Evil: 1`, okEnv), http.StatusBadRequest},
		{"LD_PRELOAD", "POST", "/lchat/routes", create("a.example.com", `{"LD_PRELOAD":"`+secretValue+`"}`), http.StatusBadRequest},
		{"PATH", "POST", "/lchat/routes", create("a.example.com", `{"PATH":"`+secretValue+`"}`), http.StatusBadRequest},
		{"LCHAT_SOCKET", "POST", "/lchat/routes", create("a.example.com", `{"LCHAT_SOCKET":"`+secretValue+`"}`), http.StatusBadRequest},
		{"env name with =", "POST", "/lchat/routes", create("a.example.com", `{"A=B":"`+secretValue+`"}`), http.StatusBadRequest},
		{"empty env name", "POST", "/lchat/routes", create("a.example.com", `{"":"`+secretValue+`"}`), http.StatusBadRequest},
		{"env the kind does not allow", "POST", "/lchat/routes", create("a.example.com", `{"OTHER":"`+secretValue+`"}`), http.StatusBadRequest},
		{"kind not configured", "POST", "/lchat/routes", `{"host":"a.example.com","kind":"evil"}`, http.StatusBadRequest},
		{"hibernating with upstream", "POST", "/lchat/routes", `{"host":"a.example.com","kind":"demo","hibernate":true,"upstream":"/run/x.sock"}`, http.StatusBadRequest},
		{"bad home_region", "POST", "/lchat/routes", `{"host":"a.example.com","kind":"demo","home_region":"../eu"}`, http.StatusBadRequest},
		{"GET dot-dot", "GET", "/lchat/routes/%2e%2e", "", http.StatusBadRequest},
		{"DELETE escaped slash", "DELETE", "/lchat/routes/..%2Fx", "", http.StatusBadRequest},
		{"DELETE unicode", "DELETE", "/lchat/routes/b%C3%BCcher.example.com", "", http.StatusBadRequest},
		{"limit zero", "GET", "/lchat/routes?limit=0", "", http.StatusBadRequest},
		{"limit huge", "GET", "/lchat/routes?limit=99999999999999999999", "", http.StatusBadRequest},
		{"unknown action", "POST", "/lchat/routes/a.example.com/exec", "{}", http.StatusNotFound},
		{"wrong method", "PUT", "/lchat/routes", create("a.example.com", okEnv), http.StatusMethodNotAllowed},
	} {
		code, msg := adminRaw(a, tc.method, tc.path, tc.body)
		if code != tc.want {
			t.Errorf("%s: %d %q, want %d", tc.name, code, msg, tc.want)
		}
		if msg == "" {
			t.Errorf("%s: no message says what is wrong", tc.name)
		}
		if strings.Contains(msg, secretValue) || strings.Contains(msg, "'q'") {
			t.Errorf("%s: the answer echoes the body's env value: %q", tc.name, msg)
		}
	}
	if n := reg.Len(); n != 0 {
		t.Fatalf("refused requests stored %d routes: %v", n, summaries(allRoutes(t, reg)))
	}

	// A stored route's env value is never shown, by any endpoint.
	if code, msg := adminRaw(a, "POST", "/lchat/routes", create("a.example.com", okEnv)); code != http.StatusCreated || strings.Contains(msg, secretValue) {
		t.Fatalf("create: %d %q", code, msg)
	}
	for _, path := range []string{"/lchat/routes", "/lchat/routes/a.example.com", "/lchat/status"} {
		if code, msg := adminRaw(a, "GET", path, ""); code != http.StatusOK || strings.Contains(msg, secretValue) || !strings.Contains(msg, "a.example.com") && path != "/lchat/status" {
			t.Errorf("GET %s: %d %q", path, code, msg)
		}
	}
	before := allRoutes(t, reg)
	for _, body := range []string{`{}`, `{"hibernate":"yes"}`, `{"hibernate":false,"upstream":"127.0.0.1:1"} {}`, `{"hibernate":true,"kind":"evil"}`} {
		if code, msg := adminRaw(a, "POST", "/lchat/routes/a.example.com/hibernate", body); code != http.StatusBadRequest {
			t.Errorf("hibernate %s: %d %q, want 400", body, code, msg)
		}
	}
	if code, _ := adminRaw(a, "POST", "/lchat/routes", create("a.example.com", `{"DEMO_SECRET":"other"}`)); code != http.StatusConflict {
		t.Errorf("second create of a host: %d, want 409", code)
	}
	if after := allRoutes(t, reg); !reflect.DeepEqual(before, after) {
		t.Fatalf("refused requests changed the route:\n%+v\n%+v", summaries(before), summaries(after))
	}
}

// meshAPIDo serves one peer-API request and returns its status and error message.
func meshAPIDo(h *MeshAPI, method, path, auth, body string) (int, string) {
	return meshAPIServe(h, meshAPIRequest(method, path, auth, body))
}

// meshAPIRequest is a peer-API request with the Authorization auth (none when empty).
func meshAPIRequest(method, path, auth, body string) *http.Request {
	req := httptest.NewRequest(method, "https://box-a.example.net"+path, strings.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	return req
}

// meshAPIServe serves req and returns its status and error message.
func meshAPIServe(h *MeshAPI, req *http.Request) (int, string) {
	w := httptest.NewRecorder()
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		w.WriteHeader(http.StatusTeapot)
		return nil
	})
	if err := h.ServeHTTP(w, req, next); err != nil {
		var he caddyhttp.HandlerError
		if asHandlerError(err, &he) {
			return he.StatusCode, he.Err.Error()
		}
		return 0, err.Error()
	}
	return w.Code, w.Body.String()
}

// TestMeshAPIRefusesHostileRows: without the right bearer token nothing is served; a
// replicated row that is malformed, out of scope, or tries to set loader, shell or box
// variables, take over a route this box serves live, or name a local upstream is refused
// with a 4xx (or, for extra fields, stripped) and the registry stays as it was.
func TestMeshAPIRefusesHostileRows(t *testing.T) {
	const token = "peer-token-never-shown"
	app := testApp(t, boxtest.Options{Mesh: mesh.Config{Self: "https://box-a.example.net", Domains: []string{"mesh.test"}, Token: token}})
	h := &MeshAPI{app: app, MaxRowBytes: 4096}
	reg := app.box.Registry()
	if _, err := reg.Put(registry.Route{Host: "live.mesh.test", Upstream: "127.0.0.1:9"}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Put(registry.Route{Host: "keep.mesh.test", Kind: "demo", Hibernate: true, Env: map[string]string{"DEMO_SECRET": "orig"}}); err != nil {
		t.Fatal(err)
	}
	before := allRoutes(t, reg)

	bearer := "Bearer " + token
	row := func(host, env string) string {
		return `{"host":"` + host + `","kind":"demo","hibernate":true,"env":` + env + `}`
	}
	keep := row("keep.mesh.test", `{"DEMO_SECRET":"`+secretValue+`"}`)
	for _, tc := range []struct {
		name, method, path, auth, body string
		want                           int
	}{
		{"no token", "PUT", "/api/mesh/route/keep.mesh.test", "", keep, http.StatusUnauthorized},
		{"wrong token", "PUT", "/api/mesh/route/keep.mesh.test", "Bearer wrong", keep, http.StatusUnauthorized},
		{"token prefix", "PUT", "/api/mesh/route/keep.mesh.test", bearer[:len(bearer)-1], keep, http.StatusUnauthorized},
		{"token plus suffix", "PUT", "/api/mesh/route/keep.mesh.test", bearer + "x", keep, http.StatusUnauthorized},
		{"basic scheme", "PUT", "/api/mesh/route/keep.mesh.test", "Basic " + token, keep, http.StatusUnauthorized},
		{"no token, listing", "GET", "/api/mesh/routes", "", "", http.StatusUnauthorized},
		{"no token, status", "GET", "/api/mesh/status", "", "", http.StatusUnauthorized},
		{"no token, delete", "DELETE", "/api/mesh/route/keep.mesh.test", "Bearer ", "", http.StatusUnauthorized},
		{"oversized", "PUT", "/api/mesh/route/keep.mesh.test", bearer, row("keep.mesh.test", `{"DEMO_SECRET":"`+strings.Repeat("v", 5000)+`"}`), http.StatusBadRequest},
		{"bad JSON", "PUT", "/api/mesh/route/keep.mesh.test", bearer, `{"host":"keep.mesh.test",`, http.StatusBadRequest},
		{"trailing data", "PUT", "/api/mesh/route/keep.mesh.test", bearer, keep + `{}`, http.StatusBadRequest},
		{"LCHAT_SOCKET", "PUT", "/api/mesh/route/keep.mesh.test", bearer, row("keep.mesh.test", `{"LCHAT_SOCKET":"`+secretValue+`"}`), http.StatusBadRequest},
		{"LCHAT_DATA_DIR", "PUT", "/api/mesh/route/keep.mesh.test", bearer, row("keep.mesh.test", `{"LCHAT_DATA_DIR":"`+secretValue+`"}`), http.StatusBadRequest},
		{"LD_PRELOAD", "PUT", "/api/mesh/route/keep.mesh.test", bearer, row("keep.mesh.test", `{"LD_PRELOAD":"`+secretValue+`"}`), http.StatusBadRequest},
		{"PATH", "PUT", "/api/mesh/route/keep.mesh.test", bearer, row("keep.mesh.test", `{"PATH":"`+secretValue+`"}`), http.StatusBadRequest},
		{"BASH_ENV", "PUT", "/api/mesh/route/keep.mesh.test", bearer, row("keep.mesh.test", `{"BASH_ENV":"`+secretValue+`"}`), http.StatusBadRequest},
		{"env name with =", "PUT", "/api/mesh/route/keep.mesh.test", bearer, row("keep.mesh.test", `{"A=B":"`+secretValue+`"}`), http.StatusBadRequest},
		{"env the kind does not allow", "PUT", "/api/mesh/route/keep.mesh.test", bearer, row("keep.mesh.test", `{"OTHER":"`+secretValue+`"}`), http.StatusBadRequest},
		{"NUL in a value", "PUT", "/api/mesh/route/keep.mesh.test", bearer, row("keep.mesh.test", `{"DEMO_SECRET":"`+secretValue+`\u0000"}`), http.StatusBadRequest},
		{"kind not configured here", "PUT", "/api/mesh/route/keep.mesh.test", bearer, `{"host":"keep.mesh.test","kind":"evil","hibernate":true}`, http.StatusBadRequest},
		{"dot-dot host", "PUT", "/api/mesh/route/..%2Fx", bearer, row("../x", `{}`), http.StatusBadRequest},
		{"no host in path", "PUT", "/api/mesh/route/", bearer, keep, http.StatusBadRequest},
		{"unicode host", "PUT", "/api/mesh/route/b%C3%BCcher.mesh.test", bearer, row("bücher.mesh.test", `{}`), http.StatusBadRequest},
		{"path and body disagree", "PUT", "/api/mesh/route/other.mesh.test", bearer, keep, http.StatusBadRequest},
		{"out of scope", "PUT", "/api/mesh/route/x.other.test", bearer, row("x.other.test", `{}`), http.StatusBadRequest},
		{"take over a live local route", "PUT", "/api/mesh/route/live.mesh.test", bearer,
			`{"host":"live.mesh.test","kind":"demo","hibernate":false,"lives_at":"https://evil.example.net"}`, http.StatusConflict},
		{"hibernate a live local route", "PUT", "/api/mesh/route/live.mesh.test", bearer, row("live.mesh.test", `{}`), http.StatusConflict},
		{"lives_at with a path", "PUT", "/api/mesh/route/keep.mesh.test", bearer,
			`{"host":"keep.mesh.test","kind":"demo","hibernate":false,"lives_at":"https://evil.example.net/x"}`, http.StatusBadRequest},
		{"tombstone a live local route", "DELETE", "/api/mesh/route/live.mesh.test", bearer, "", http.StatusConflict},
		{"tombstone a dot-dot host", "DELETE", "/api/mesh/route/..", bearer, "", http.StatusBadRequest},
		{"tombstone out of scope", "DELETE", "/api/mesh/route/keep.other.test", bearer, "", http.StatusBadRequest},
		{"wrong method", "POST", "/api/mesh/route/keep.mesh.test", bearer, keep, http.StatusMethodNotAllowed},
	} {
		code, msg := meshAPIDo(h, tc.method, tc.path, tc.auth, tc.body)
		if code != tc.want {
			t.Errorf("%s: %d %q, want %d", tc.name, code, msg, tc.want)
		}
		if strings.Contains(msg, secretValue) || strings.Contains(msg, token) {
			t.Errorf("%s: the answer echoes a secret: %q", tc.name, msg)
		}
	}
	if after := allRoutes(t, reg); !reflect.DeepEqual(before, after) {
		t.Fatalf("refused peer requests changed the registry (env values not shown):\n%+v\n%+v", summaries(before), summaries(after))
	}
	if n := app.box.Mesh().C.RowsIn.Load(); n != 0 {
		t.Fatalf("rows_in = %d after refused rows", n)
	}

	// Extra fields cannot smuggle a local upstream, a command or a socket in: the row
	// is stored as a plain space of this box's kind.
	code, msg := meshAPIDo(h, "PUT", "/api/mesh/route/new.mesh.test", bearer,
		`{"host":"new.mesh.test","kind":"demo","hibernate":true,"upstream":"/var/run/docker.sock","command":"/bin/sh","socket":"/tmp/x.sock","env":{"DEMO_SECRET":"`+secretValue+`"}}`)
	if code != http.StatusOK || strings.Contains(msg, secretValue) {
		t.Fatalf("valid row with extra fields: %d %q", code, msg)
	}
	rt, ok := reg.Lookup("new.mesh.test")
	if !ok || rt.Upstream != "" || rt.LivesAt != "" || !rt.Hibernate || rt.Kind != "demo" || rt.Env["DEMO_SECRET"] != secretValue {
		t.Fatalf("stored row = %+v (DEMO_SECRET kept: %v)", rt.Summary(), rt.Env["DEMO_SECRET"] == secretValue)
	}
	// The listing a peer can read carries no env values.
	if code, body := meshAPIDo(h, "GET", "/api/mesh/routes", bearer, ""); code != http.StatusOK || strings.Contains(body, secretValue) || !strings.Contains(body, "new.mesh.test") {
		t.Fatalf("GET routes: %d %q", code, body)
	}
}

// TestForwardedMarkerFromOutside: a request carrying a forged marker, a marker made for
// another host, or a valid marker next to a junk one is forwarded like any other (the
// marker cannot suppress forwarding), the peer receives only the marker this box made,
// and a client's scheduled-wake header never reaches it.
func TestForwardedMarkerFromOutside(t *testing.T) {
	var mu sync.Mutex
	var got []http.Header
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
		io.WriteString(w, "peer")
	}))
	defer peer.Close()

	const host = "fwd.mesh.test"
	app, cctx := testMesh(t)
	if _, err := app.box.Registry().Put(mesh.RouteFromRow(mesh.RouteRow{Host: host, Kind: "demo", LivesAt: peer.URL})); err != nil {
		t.Fatal(err)
	}
	ms := app.box.Mesh()
	h := &Handler{RetryAfter: caddy.Duration(time.Second), app: app}
	var err error
	if h.meshProxy, err = newForwardProxy(cctx, ms, -1); err != nil {
		t.Fatal(err)
	}

	forged := mesh.Marker{Token: "guessed-token"}
	real := ms.Marker()
	now := time.Now()
	for _, tc := range []struct {
		name    string
		markers []string
	}{
		{"forged", []string{forged.Sign(host, now)}},
		{"for another host", []string{real.Sign("other.mesh.test", now)}},
		{"expired", []string{real.Sign(host, now.Add(-time.Hour))}},
		{"valid next to junk", []string{real.Sign(host, now.Add(-2*time.Second)), "1.junk"}},
		{"garbage", []string{"\x00\xff"}},
	} {
		mu.Lock()
		got = nil
		mu.Unlock()
		req := httptest.NewRequest("GET", "http://"+host+"/x", nil)
		for _, m := range tc.markers {
			req.Header.Add(mesh.ForwardedHeader, m)
		}
		req.Header.Set("X-Lchat-Wake-Reason", "scheduled")
		w := httptest.NewRecorder()
		req = caddyhttp.PrepareRequest(req, caddy.NewReplacer(), w, &caddyhttp.Server{})
		err := h.ServeHTTP(w, req, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
		mu.Lock()
		hits := got
		mu.Unlock()
		if err != nil || w.Code != http.StatusOK || len(hits) != 1 {
			t.Errorf("%s: %v %d, %d peer hits; want the request forwarded once", tc.name, err, w.Code, len(hits))
			continue
		}
		seen := hits[0].Values(mesh.ForwardedHeader)
		if len(seen) != 1 || real.Verify(seen[0], host) != nil {
			t.Errorf("%s: the peer got markers %q, want one this box made", tc.name, seen)
		}
		for _, m := range tc.markers {
			if len(seen) == 1 && seen[0] == m {
				t.Errorf("%s: the client's marker reached the peer", tc.name)
			}
		}
		if v := hits[0].Get("X-Lchat-Wake-Reason"); v != "" {
			t.Errorf("%s: the peer got X-Lchat-Wake-Reason %q from a client", tc.name, v)
		}
	}
	if n := ms.C.MarkersStripped.Load(); n != 5 {
		t.Errorf("markers_stripped = %d, want 5", n)
	}
}

// TestPeerRowLivesAtMustBeAMember: a replicated live row may pin its host only to a live
// box of this mesh. Any other lives_at (a metadata service, an internal address) would
// make every box forward the host's requests there, so it is 409 and stores nothing.
func TestPeerRowLivesAtMustBeAMember(t *testing.T) {
	bkt := membucket.New()
	boxtest.Join(t, bkt, "https://box-b.example.net")
	const token = "peer-token"
	app := testApp(t, boxtest.Options{Bucket: bkt, Mesh: mesh.Config{Self: "https://box-a.example.net", Domains: []string{"mesh.test"}, Token: token}})
	h := &MeshAPI{app: app, MaxRowBytes: 4096}
	live := func(host, at string) string {
		return `{"host":"` + host + `","kind":"demo","hibernate":false,"lives_at":"` + at + `"}`
	}
	for _, at := range []string{"http://169.254.169.254", "http://10.0.0.1:8080", "https://box-c.example.net", "http://box-b.example.net"} {
		if code, msg := meshAPIDo(h, "PUT", "/api/mesh/route/x.mesh.test", "Bearer "+token, live("x.mesh.test", at)); code != http.StatusConflict {
			t.Errorf("lives_at %s: %d %q, want 409", at, code, msg)
		}
	}
	if n := app.box.Registry().Len(); n != 0 {
		t.Fatalf("%d rows stored with a lives_at outside the mesh", n)
	}
	if code, msg := meshAPIDo(h, "PUT", "/api/mesh/route/x.mesh.test", "Bearer "+token, live("x.mesh.test", "HTTPS://Box-B.example.net")); code != http.StatusOK {
		t.Fatalf("lives_at a live member: %d %q", code, msg)
	}
	if rt, ok := app.box.Registry().Lookup("x.mesh.test"); !ok || rt.LivesAt != "https://box-b.example.net" || rt.Upstream != "" {
		t.Fatalf("stored row = %+v", rt.Summary())
	}
}
