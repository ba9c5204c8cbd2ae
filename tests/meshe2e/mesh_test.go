package meshe2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestStartupRefusals: SELF without domains or token, or a SELF with a path, stops
// start-up with a message naming the variable and never the token.
func TestStartupRefusals(t *testing.T) {
	bin := harness.Binary(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"apps":{"lchat":{"bucket":{"backend":"file","root":%q},
		"state_dir":%q,"registry":%q}}}`, filepath.Join(dir, "bucket"), filepath.Join(dir, "st"), filepath.Join(dir, "reg.db"))
	cfgFile := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	const secret = "do-not-print-this-token-9c8b7a6f5e4d"
	cases := []struct {
		name, want string
		env        []string
	}{
		{"no domains", mesh.EnvDomains, []string{mesh.EnvSelf + "=https://box-1.example.net", mesh.EnvToken + "=" + secret}},
		{"no token", mesh.EnvToken, []string{mesh.EnvSelf + "=https://box-1.example.net", mesh.EnvDomains + "=example.com"}},
		{"self with path", mesh.EnvSelf, []string{mesh.EnvSelf + "=https://box-1.example.net/x", mesh.EnvDomains + "=example.com", mesh.EnvToken + "=" + secret}},
		{"self without scheme", mesh.EnvSelf, []string{mesh.EnvSelf + "=box-1.example.net", mesh.EnvDomains + "=example.com", mesh.EnvToken + "=" + secret}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "run", "--config", cfgFile)
			cmd.Env = append([]string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir, "PATH=" + os.Getenv("PATH")}, tc.env...)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("started with %s; want a refusal:\n%s", tc.name, out)
			}
			if ctx.Err() != nil {
				t.Fatalf("still running after a minute; want a refusal")
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("refusal does not name %s:\n%s", tc.want, out)
			}
			if strings.Contains(string(out), secret) {
				t.Errorf("refusal prints the token:\n%s", out)
			}
		})
	}
}

// TestMesh runs one three-box cluster through the mesh's life: membership, placement,
// forwarding (TLS, WebSockets, spoofed markers), replication, mesh-seed, a box cut
// off from the bucket, and graceful and hard failover.
func TestMesh(t *testing.T) {
	c := newCluster(t)
	a := c.start(false)
	b := c.start(false)
	started := time.Now()
	cc := c.start(true) // its bucket traffic goes through a proxy the fence step cuts
	all := []*node{a, b, cc}

	// Membership converges within one beat of the last box's start.
	conv := harness.WaitFor(t, 5*time.Second, "every box sees three live members", func() bool {
		for _, n := range all {
			if len(status(t, n).Mesh.Live) != 3 {
				return false
			}
		}
		return true
	})
	t.Logf("FIGURE membership converged %v after the third box was up (%v after its start began; beat %v)",
		conv, time.Since(started), beat)
	if conv > beat+500*time.Millisecond {
		t.Errorf("membership took %v to converge, more than one beat (%v) plus slack", conv, beat)
	}

	t.Run("replication", func(t *testing.T) {
		host := "rep." + meshDomain
		c.createSpace(a, host)
		d := harness.WaitFor(t, 5*time.Second, "row replicated to both peers", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })
		t.Logf("FIGURE create fan-out reached both peers in %v", d)
		var sum struct {
			EnvNames []string `json:"env_names"`
		}
		b.AdminJSON("GET", "/lchat/routes/"+host, nil, 200, &sum)
		if len(sum.EnvNames) != 1 || sum.EnvNames[0] != "DEMO_SECRET" {
			t.Errorf("replicated row env names = %v, want [DEMO_SECRET]", sum.EnvNames)
		}
		a.AdminJSON("DELETE", "/lchat/routes/"+host, nil, 200, nil)
		d = harness.WaitFor(t, 5*time.Second, "tombstone on both peers", func() bool { return !hasRoute(b, host) && !hasRoute(cc, host) })
		t.Logf("FIGURE delete tombstones reached both peers in %v", d)
		for _, n := range all {
			if strings.Contains(n.Logs(), "s3cr3t-env-value") || strings.Contains(n.Logs(), meshToken) {
				t.Errorf("%s logged a secret", n.self)
			}
		}
	})

	t.Run("peer API", func(t *testing.T) {
		put := func(token, host, body string) int {
			req, _ := http.NewRequest("PUT", b.self+mesh.PathRoute+host, strings.NewReader(body))
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := c.client(b).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		h := "api." + meshDomain
		row := fmt.Sprintf(`{"host":%q,"kind":"demo","hibernate":true}`, h)
		if code := put("", h, row); code != 401 {
			t.Errorf("PUT without token: %d, want 401", code)
		}
		if code := put("wrong", h, row); code != 401 {
			t.Errorf("PUT with a wrong token: %d, want 401", code)
		}
		if code := put(meshToken, "x.other.test", `{"host":"x.other.test","kind":"demo","hibernate":true}`); code != 400 {
			t.Errorf("PUT out of scope: %d, want 400", code)
		}
		if code := put(meshToken, h, fmt.Sprintf(`{"host":%q,"kind":"demo","hibernate":true,"env":{"LD_PRELOAD":"/x.so"}}`, h)); code != 400 {
			t.Errorf("PUT with LD_PRELOAD: %d, want 400", code)
		}
		if code := put(meshToken, h, fmt.Sprintf(`{"host":%q,"kind":"demo","hibernate":true,"env":{"OTHER":"x"}}`, h)); code != 400 {
			t.Errorf("PUT with an env name the kind does not allow: %d, want 400", code)
		}
		if hasRoute(b, h) {
			t.Fatalf("a refused row was stored")
		}
		if code := put(meshToken, h, row); code != 200 {
			t.Fatalf("valid PUT: %d", code)
		}
		if !hasRoute(b, h) {
			t.Fatalf("a valid row was not stored")
		}
		req, _ := http.NewRequest("DELETE", b.self+mesh.PathRoute+h, nil)
		req.Header.Set("Authorization", "Bearer "+meshToken)
		for i := 0; i < 2; i++ { // idempotent
			resp, err := c.client(b).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("DELETE #%d: %d", i+1, resp.StatusCode)
			}
		}
		if hasRoute(b, h) {
			t.Errorf("tombstoned row still there")
		}

		// A host outside the mesh domains is served by the box that has it, even
		// where HRW over the members would pick another box.
		local := ""
		for i := 0; local == ""; i++ {
			h := fmt.Sprintf("y%d.other.test", i)
			if o, _ := mesh.Owner(h, members(all...), ""); o.Self != b.self {
				local = h
			}
		}
		b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": local, "kind": "demo"}, http.StatusCreated, nil)
		req, _ = http.NewRequest("DELETE", b.self+mesh.PathRoute+local, nil)
		req.Header.Set("Authorization", "Bearer "+meshToken)
		resp, err := c.client(b).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 || !hasRoute(b, local) {
			t.Errorf("DELETE out of scope: %d, row still there: %v; want 400 and the row kept", resp.StatusCode, hasRoute(b, local))
		}
		fw := status(t, b).Mesh.Counters["forwards"]
		cl := c.client(b)
		// The test certificate covers the mesh domain only: present that name, ask for local.
		cl.Transport.(*http.Transport).TLSClientConfig.ServerName = "sni." + meshDomain
		resp, err = cl.Get("https://" + local + "/api/messages")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s via b: %d, want 200 (served locally)", local, resp.StatusCode)
		}
		if got := status(t, b).Mesh.Counters["forwards"]; got != fw {
			t.Errorf("b forwarded a request for %s, outside the mesh domains (forwards %d→%d)", local, fw, got)
		}
		if on := awakeOn(t, local, all...); len(on) != 1 || on[0] != b.self {
			t.Errorf("%s awake on %v, want only on %s", local, on, b.self)
		}
	})

	t.Run("placement and one hop", func(t *testing.T) {
		live := members(all...)
		for _, owner := range all {
			host := hostOwnedBy(t, "own", owner, all...)
			if o, _ := mesh.Owner(host, live, ""); o.Self != owner.self {
				t.Fatal("test placement broken")
			}
			c.createSpace(a, host)
			harness.WaitFor(t, 5*time.Second, "row everywhere", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })
			for _, entry := range all {
				before, ob := status(t, entry).Mesh.Counters, status(t, owner).Mesh.Counters
				c.mustDo(entry, "GET", host, "/api/messages", "", 200)
				after, oa := status(t, entry).Mesh.Counters, status(t, owner).Mesh.Counters
				if entry == owner {
					if after["forwards"] != before["forwards"] {
						t.Errorf("owner %s forwarded a request for its own host", owner.self)
					}
				} else {
					if after["forwards"] != before["forwards"]+1 || oa["forwarded_in"] != ob["forwarded_in"]+1 {
						t.Errorf("request for %s via %s: forwards %d→%d, owner forwarded_in %d→%d; want one hop to %s",
							host, entry.self, before["forwards"], after["forwards"], ob["forwarded_in"], oa["forwarded_in"], owner.self)
					}
				}
			}
			if got := awakeOn(t, host, all...); len(got) != 1 || got[0] != owner.self {
				t.Errorf("%s awake on %v, want only on its owner %s", host, got, owner.self)
			}
		}
	})

	t.Run("spoofed marker", func(t *testing.T) {
		host := hostOwnedBy(t, "own", b, all...) // created above
		before := status(t, a).Mesh.Counters
		for _, v := range []string{"1.deadbeef", fmt.Sprintf("%d.%064x", time.Now().Unix(), 0), "garbage"} {
			code, body, err := c.do(a, "GET", host, "/api/messages", "", http.Header{mesh.ForwardedHeader: {v}})
			if err != nil || code != 200 {
				t.Fatalf("spoofed request: %d %v %.200s", code, err, body)
			}
		}
		after := status(t, a).Mesh.Counters
		if after["markers_stripped"] != before["markers_stripped"]+3 || after["forwards"] != before["forwards"]+3 {
			t.Errorf("spoofed markers: stripped %d→%d, forwards %d→%d; want 3 stripped and still forwarded",
				before["markers_stripped"], after["markers_stripped"], before["forwards"], after["forwards"])
		}
		if got := awakeOn(t, host, all...); len(got) != 1 || got[0] != b.self {
			t.Errorf("%s awake on %v after spoofed requests, want only %s", host, got, b.self)
		}
	})

	t.Run("lease conflicts", func(t *testing.T) {
		markedHop := func(host string, hop int) http.Header {
			h := http.Header{}
			mesh.Marker{Token: meshToken}.MarkHop(h, host, hop)
			return h
		}
		marked := func(host string) http.Header { return markedHop(host, 1) }
		// Requests marked as forwarded twice are served where they land, so all three
		// boxes race to wake one space: exactly one instance runs; the others forward
		// once more, to the winner that holds the lease, and count it.
		host := hostOwnedBy(t, "race", b, all...)
		c.createSpace(a, host)
		harness.WaitFor(t, 5*time.Second, "row everywhere", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })
		before := map[string]map[string]uint64{}
		for _, n := range all {
			before[n.self] = status(t, n).Mesh.Counters
		}
		type answer struct {
			self, retry string
			code        int
			err         error
		}
		const perBox = 4
		answers := make(chan answer, perBox*len(all))
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for _, n := range all {
			for i := 0; i < perBox; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-gate
					code, hdr, _, err := c.doH(n, "GET", host, "/api/messages", "", markedHop(host, 2))
					answers <- answer{self: n.self, retry: hdr.Get("Retry-After"), code: code, err: err}
				}()
			}
		}
		close(gate)
		wg.Wait()
		close(answers)
		ok, busy := map[string]int{}, map[string]int{}
		for ans := range answers {
			switch {
			case ans.err != nil:
				t.Errorf("racing wake via %s: %v", ans.self, ans.err)
			case ans.code == 200:
				ok[ans.self]++
			case ans.code == 503 && ans.retry != "":
				busy[ans.self]++
			default:
				t.Errorf("racing wake via %s: %d (Retry-After %q), want 200, or 503 with Retry-After", ans.self, ans.code, ans.retry)
			}
		}
		on := awakeOn(t, host, all...)
		if len(on) != 1 {
			t.Fatalf("racing wakes left %s awake on %v, want exactly one box", host, on)
		}
		for _, n := range all {
			if ok[n.self] != perBox {
				t.Errorf("%s answered %d of %d racing requests with 200 (%d×503)", n.self, ok[n.self], perBox, busy[n.self])
			}
			if n.self == on[0] {
				continue
			}
			if got := status(t, n).Mesh.Counters["holder_forwards"] - before[n.self]["holder_forwards"]; got < 1 {
				t.Errorf("loser %s: holder_forwards +%d, want its requests forwarded to the holder", n.self, got)
			}
		}
		// A request that has made its last forward is never forwarded again: on a box
		// that is not the holder it is a 503 with Retry-After, counted.
		for _, n := range all {
			if n.self == on[0] {
				continue
			}
			busyBefore := status(t, n).Mesh.Counters["lease_busy"]
			code, hdr, _, err := c.doH(n, "GET", host, "/api/messages", "", markedHop(host, mesh.MaxHops))
			if err != nil || code != 503 || hdr.Get("Retry-After") == "" || status(t, n).Mesh.Counters["lease_busy"] != busyBefore+1 {
				t.Errorf("a request on its last hop via %s (not the holder): %d %v, Retry-After %q; want a counted 503", n.self, code, err, hdr.Get("Retry-After"))
			}
		}

		// The loser of a lease conflict forwards once to the holder: a wakes h2 (a
		// marked request stays there), then b, its owner, gets a plain request for it.
		h2 := hostOwnedBy(t, "held", b, all...)
		c.createSpace(a, h2)
		harness.WaitFor(t, 5*time.Second, "row everywhere", func() bool { return hasRoute(b, h2) && hasRoute(cc, h2) })
		if code, _, body, err := c.doH(a, "GET", h2, "/api/messages", "", marked(h2)); err != nil || code != 200 {
			t.Fatalf("marked request to a: %d %v %.200s", code, err, body)
		}
		bb, ab := status(t, b).Mesh.Counters, status(t, a).Mesh.Counters
		c.mustDo(b, "GET", h2, "/api/messages", "", 200)
		ba, aa := status(t, b).Mesh.Counters, status(t, a).Mesh.Counters
		if ba["holder_forwards"] != bb["holder_forwards"]+1 || aa["forwarded_in"] != ab["forwarded_in"]+1 {
			t.Errorf("b's holder_forwards %d→%d, a's forwarded_in %d→%d; want one forward from the owner to the holder",
				bb["holder_forwards"], ba["holder_forwards"], ab["forwarded_in"], aa["forwarded_in"])
		}
		if on := awakeOn(t, h2, all...); len(on) != 1 || on[0] != a.self {
			t.Errorf("%s awake on %v, want only on the lease holder %s", h2, on, a.self)
		}
		// A space stays where it is awake: a, not its owner, serves a plain request
		// for h2 itself.
		before2 := status(t, a).Mesh.Counters["forwards"]
		c.mustDo(a, "GET", h2, "/api/messages", "", 200)
		if after2 := status(t, a).Mesh.Counters["forwards"]; after2 != before2 {
			t.Errorf("a forwarded a request for %s, awake on a itself (forwards %d→%d)", h2, before2, after2)
		}
	})

	t.Run("websocket through a forward", func(t *testing.T) {
		host := hostOwnedBy(t, "own", cc, all...)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, "wss://"+host+"/api/ws", &websocket.DialOptions{HTTPClient: c.client(a)})
		if err != nil {
			t.Fatalf("WebSocket via a non-owner: %v", err)
		}
		defer ws.CloseNow()
		c.post(b, host, "over the websocket")
		for {
			_, data, err := ws.Read(ctx)
			if err != nil {
				t.Fatalf("reading the WebSocket: %v", err)
			}
			if strings.Contains(string(data), "over the websocket") {
				break
			}
		}
	})

	t.Run("mesh-seed", func(t *testing.T) {
		peerReq := func(method, host, body string) {
			t.Helper()
			req, _ := http.NewRequest(method, b.self+mesh.PathRoute+host, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+meshToken)
			resp, err := c.client(b).Do(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("%s %s on %s: %v %v", method, host, b.self, err, resp)
			}
			resp.Body.Close()
		}
		missing := hostOwnedBy(t, "own", a, all...) // exists on every box
		peerReq("DELETE", missing, "")              // now missing on b only
		stray := "stray." + meshDomain
		peerReq("PUT", stray, fmt.Sprintf(`{"host":%q,"kind":"demo","hibernate":true}`, stray)) // only on b
		out, err := a.CLI("mesh-seed", "--prune", b.self)
		t.Logf("mesh-seed output:\n%s", out)
		if err != nil {
			t.Fatalf("mesh-seed: %v", err)
		}
		if !hasRoute(b, missing) || hasRoute(b, stray) {
			t.Errorf("after mesh-seed --prune: %s present=%v (want true), %s present=%v (want false)",
				missing, hasRoute(b, missing), stray, hasRoute(b, stray))
		}
		if !strings.Contains(out, "replicated "+missing) || !strings.Contains(out, "tombstoned "+stray) || !strings.Contains(out, "done:") {
			t.Errorf("mesh-seed progress lacks the rows it handled")
		}

		// Zero-source guard: a seed scoped to domains this box has no rows under refuses to prune.
		envFile := filepath.Join(t.TempDir(), "router.env")
		os.WriteFile(envFile, []byte("LCHAT_MESH_SELF="+a.self+"\nLCHAT_MESH_DOMAINS=empty.test\nLCHAT_MESH_TOKEN="+meshToken+"\n"), 0o600)
		var routesBefore, routesAfter struct{ Routes []any }
		b.AdminJSON("GET", "/lchat/routes?limit=1000", nil, 200, &routesBefore)
		before := status(t, b)
		out, err = a.CLI("mesh-seed", "--env-file", envFile, "--prune", b.self)
		if err == nil || !strings.Contains(out, "refusing to prune") {
			t.Errorf("mesh-seed --prune from zero in-scope rows: err=%v, output:\n%s", err, out)
		}
		if strings.Contains(out, meshToken) {
			t.Errorf("mesh-seed printed the token")
		}
		b.AdminJSON("GET", "/lchat/routes?limit=1000", nil, 200, &routesAfter)
		if len(routesAfter.Routes) != len(routesBefore.Routes) {
			t.Errorf("the refused prune changed the peer's routes: %d → %d", len(routesBefore.Routes), len(routesAfter.Routes))
		}
		if after := status(t, b); after.Mesh.Counters["tombstones_in"] != before.Mesh.Counters["tombstones_in"] {
			t.Errorf("the refused prune tombstoned rows on the peer")
		}

		// An env file without LCHAT_MESH_SELF is refused, not silently ignored.
		noSelf := filepath.Join(t.TempDir(), "no-self.env")
		os.WriteFile(noSelf, []byte("LCHAT_MESH_DOMAINS=empty.test\nLCHAT_MESH_TOKEN="+meshToken+"\n"), 0o600)
		out, err = a.CLI("mesh-seed", "--env-file", noSelf, "--prune", b.self)
		if err == nil || !strings.Contains(out, mesh.EnvSelf) || strings.Contains(out, meshToken) {
			t.Errorf("mesh-seed --env-file without SELF: err=%v, output:\n%s", err, out)
		}
	})

	t.Run("fleet", func(t *testing.T) {
		out, err := a.CLI("fleet")
		if err != nil {
			t.Fatalf("fleet: %v\n%s", err, out)
		}
		t.Logf("fleet:\n%s", out)
		for _, n := range all {
			if !strings.Contains(out, n.self) {
				t.Errorf("fleet lacks %s", n.self)
			}
		}
		if strings.Contains(out, "unreachable") {
			t.Errorf("fleet could not reach a live box")
		}
		code, metrics, err := a.Admin("GET", "/metrics", nil)
		if err != nil || code != 200 {
			t.Fatalf("GET /metrics: %d %v", code, err)
		}
		// The fleet view's figures, as metrics: forwards, wakes, lease conflicts, awake
		// spaces, heartbeat age, live members.
		for _, want := range []string{`lchat_mesh_events_total{counter="forwards"}`, `lchat_engine_events_total{counter="wakes"}`,
			`lchat_engine_events_total{counter="lease_conflicts"}`, `lchat_spaces{state="awake"}`,
			"lchat_mesh_heartbeat_age_seconds ", "lchat_mesh_live_members 3", "lchat_mesh_fenced 0"} {
			if !strings.Contains(string(metrics), want) {
				t.Errorf("Prometheus metrics lack %s", want)
			}
		}
	})

	t.Run("hibernate flip pins the host to its box", func(t *testing.T) {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "live upstream on the origin box")
		}))
		defer up.Close()
		host := hostOwnedBy(t, "flip", b, all...) // b would own it while it hibernates
		c.createSpace(a, host)
		harness.WaitFor(t, 5*time.Second, "row everywhere", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })
		a.AdminJSON("POST", "/lchat/routes/"+host+"/hibernate",
			map[string]any{"hibernate": false, "upstream": strings.TrimPrefix(up.URL, "http://")}, 200, nil)
		harness.WaitFor(t, 5*time.Second, "peers store the lives-elsewhere row", func() bool {
			for _, n := range []*node{b, cc} {
				var sum struct {
					Hibernate bool   `json:"hibernate"`
					LivesAt   string `json:"lives_at"`
					Upstream  string `json:"upstream"`
				}
				n.AdminJSON("GET", "/lchat/routes/"+host, nil, 200, &sum)
				if sum.Upstream != "" {
					t.Fatalf("%s stores the pinned row with upstream %q; a lives_at row has none", n.self, sum.Upstream)
				}
				if sum.Hibernate || sum.LivesAt != a.self {
					return false
				}
			}
			return true
		})
		for _, n := range all {
			if body := c.mustDo(n, "GET", host, "/", "", 200); body != "live upstream on the origin box" {
				t.Errorf("via %s: %q, want the origin's live upstream", n.self, body)
			}
		}
	})

	t.Run("relocate", func(t *testing.T) {
		host := "rel." + meshDomain
		c.createSpace(a, host)
		harness.WaitFor(t, 5*time.Second, "row everywhere", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })
		if out, err := a.CLI("relocate", host, "--to", "eu", "--move-dns"); err == nil || !strings.Contains(out, "DNS provider") {
			t.Errorf("relocate --move-dns without a provider: err=%v\n%s", err, out)
		}
		if out, err := a.CLI("relocate", host, "--to", "EU!"); err == nil {
			t.Errorf("relocate --to EU! (not a region label) succeeded:\n%s", out)
		}
		out, err := a.CLI("relocate", host, "--to", "eu")
		if err != nil || !strings.Contains(out, "relocated "+host) || !strings.Contains(out, "no copy") {
			t.Fatalf("relocate: %v\n%s", err, out)
		}
		harness.WaitFor(t, 5*time.Second, "peers see the new home region", func() bool {
			for _, n := range []*node{b, cc} {
				var sum struct {
					HomeRegion string `json:"home_region"`
				}
				n.AdminJSON("GET", "/lchat/routes/"+host, nil, 200, &sum)
				if sum.HomeRegion != "eu" {
					return false
				}
			}
			return true
		})
	})

	t.Run("cut off from the bucket", func(t *testing.T) {
		host := hostOwnedBy(t, "own", cc, all...)
		c.post(cc, host, "before the cut")
		waitSynced(t, cc, host, time.Now())

		// Watch every box throughout: at no moment may two run the space.
		var stop atomic.Bool
		var mu sync.Mutex
		var overlap []string
		var ccStopped, otherAwake time.Time
		var wg sync.WaitGroup
		wg.Add(1)
		defer func() { stop.Store(true); wg.Wait() }()
		go func() {
			defer wg.Done()
			for !stop.Load() {
				var on []string
				for _, n := range all {
					if st, ok := tryStatus(n); ok && st.awake(host) {
						on = append(on, n.self)
					}
				}
				now := time.Now()
				mu.Lock()
				if len(on) > 1 {
					overlap = append(overlap, fmt.Sprintf("%s: %v", now.Format(time.StampMilli), on))
				}
				ccOn := false
				for _, s := range on {
					if s == cc.self {
						ccOn = true
					}
				}
				if !ccOn && ccStopped.IsZero() {
					ccStopped = now
				}
				if len(on) > 0 && !ccOn && otherAwake.IsZero() {
					otherAwake = now
				}
				mu.Unlock()
				time.Sleep(50 * time.Millisecond)
			}
		}()

		cut := time.Now()
		cc.bucketProxy.SetDown(true)
		defer cc.bucketProxy.SetDown(false) // also when a check fails, so later subtests keep three boxes
		fenced := harness.WaitFor(t, 10*time.Second, "the cut-off box fences itself", func() bool {
			st := status(t, cc)
			return st.Mesh.Fenced && !st.awake(host)
		})
		var last string
		served := harness.WaitFor(t, 20*time.Second, "a survivor serves the space with its data", func() bool {
			code, body, err := c.do(a, "GET", host, "/api/messages", "", nil)
			last = fmt.Sprintf("%d %v %.300s", code, err, body)
			return err == nil && code == 200 && strings.Contains(body, "before the cut")
		}, func() string { return "(last answer via " + a.self + ": " + last + ")" })
		// Let the watcher see the survivor's instance before it stops watching.
		harness.WaitFor(t, 5*time.Second, "the watcher sees the survivor run the space", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return !otherAwake.IsZero()
		})
		stop.Store(true)
		wg.Wait()
		t.Logf("FIGURE cut-off box fenced %v after the cut; survivor served %v after the cut", fenced, time.Since(cut))
		_ = served
		mu.Lock()
		defer mu.Unlock()
		if len(overlap) > 0 {
			t.Errorf("two boxes ran %s at once: %v", host, overlap)
		}
		if otherAwake.IsZero() || ccStopped.IsZero() || !ccStopped.Before(otherAwake) {
			t.Errorf("cut-off box stopped at %v, another box ran the space at %v: want the fence first", ccStopped, otherAwake)
		}
		if !strings.Contains(cc.Logs(), "fencing this box") {
			t.Errorf("the fenced box did not say so in its log")
		}
		cc.bucketProxy.SetDown(false)
		harness.WaitFor(t, 15*time.Second, "the box rejoins", func() bool {
			for _, n := range all {
				st := status(t, n)
				if st.Mesh.Fenced || len(st.Mesh.Live) != 3 {
					return false
				}
			}
			return true
		})
		if got := awakeOn(t, host, all...); len(got) > 1 {
			t.Errorf("after the rejoin %s runs on %v", host, got)
		}
	})

	t.Run("graceful failover", func(t *testing.T) {
		host := hostOwnedBy(t, "fo", b, all...)
		c.createSpace(a, host)
		harness.WaitFor(t, 5*time.Second, "row everywhere", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })
		c.post(a, host, "survives a drain")
		since := time.Now()
		harness.WaitFor(t, 10*time.Second, "a sync after the post", func() bool { return status(t, b).lastSync(host).After(since) })
		if got := awakeOn(t, host, all...); len(got) != 1 || got[0] != b.self {
			t.Fatalf("%s awake on %v, want %s", host, got, b.self)
		}
		// The last write before SIGTERM reaches the bucket only through the drain's
		// checkpoint (the periodic sync may or may not have run; either way it must
		// be on the survivor).
		c.post(a, host, "posted just before SIGTERM")
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- b.Stop() }()
		var survivorBody string
		d := harness.WaitFor(t, 30*time.Second, "a survivor serves the drained box's space", func() bool {
			code, body, err := c.do(a, "GET", host, "/api/messages", "", nil)
			survivorBody = body
			return err == nil && code == 200 && strings.Contains(body, "survives a drain")
		})
		t.Logf("FIGURE SIGTERM failover: survivor served %v after SIGTERM (target ≤ 2s)", d)
		if d > 2*time.Second {
			t.Errorf("graceful failover took %v, target 2s", d)
		}
		if !strings.Contains(survivorBody, "posted just before SIGTERM") {
			t.Errorf("the survivor lacks the message posted just before SIGTERM (the drain's checkpoint): %.300s", survivorBody)
		}
		if err := <-done; err != nil {
			t.Logf("drained box exit: %v", err)
		}
		t.Logf("FIGURE SIGTERM drain: box exited %v after SIGTERM", time.Since(start))
		logs := b.Logs()
		marked, left := strings.Index(logs, "draining: heartbeat marked"), strings.Index(logs, "left the mesh: heartbeat deleted")
		if marked < 0 || left < 0 || left < marked {
			t.Errorf("drained box: heartbeat marked draining at log offset %d, deleted at %d; want marked first, deleted last", marked, left)
		}

		// Writes taken by the survivor survive its own syncs: nothing the draining box
		// wrote after the takeover fences the survivor out.
		survivors := []*node{a, cc}
		var owner *node
		// The first answer may have come from the draining box itself (it serves its awake
		// spaces until its drain puts them to sleep): requests wake it on a survivor.
		harness.WaitFor(t, 10*time.Second, "the space awake on one survivor", func() bool {
			c.do(a, "GET", host, "/api/messages", "", nil)
			on := awakeOn(t, host, survivors...)
			for _, n := range survivors {
				if len(on) == 1 && on[0] == n.self {
					owner = n
				}
			}
			return owner != nil
		})
		c.post(a, host, "written on the survivor")
		since = time.Now()
		// A sync after the post, then one more periodic sync: either would fence the
		// survivor out had the draining box written after the takeover.
		waitSynced(t, owner, host, since)
		if body := c.mustDo(a, "GET", host, "/api/messages", "", 200); !strings.Contains(body, "written on the survivor") ||
			!strings.Contains(body, "posted just before SIGTERM") {
			t.Errorf("after the survivor's syncs the space lacks a message: %.300s", body)
		}
		if got := awakeOn(t, host, survivors...); len(got) != 1 || got[0] != owner.self {
			t.Errorf("after the survivor's syncs %s runs on %v, want still on %s (not fenced out)", host, got, owner.self)
		}
	})

	t.Run("hard failover", func(t *testing.T) {
		live := []*node{a, cc}
		harness.WaitFor(t, 10*time.Second, "two live members", func() bool { return len(status(t, a).Mesh.Live) == 2 })
		host := hostOwnedBy(t, "kill", cc, live...)
		c.createSpace(a, host)
		harness.WaitFor(t, 5*time.Second, "row on the peer", func() bool { return hasRoute(cc, host) })
		c.post(a, host, "survives a kill")
		waitSynced(t, cc, host, time.Now())
		cc.Kill()
		// Until the killed box's heartbeat is dead its lease holds: every answer in
		// between must be a 503 with Retry-After (temporary), never a 502 or a 200
		// without the synced data.
		busy := 0
		var bad []string
		d := harness.WaitFor(t, deadAfter+20*time.Second, "a survivor serves the killed box's space", func() bool {
			code, hdr, body, err := c.doH(a, "GET", host, "/api/messages", "", nil)
			switch {
			case err == nil && code == 200 && strings.Contains(body, "survives a kill"):
				return true
			case err == nil && code == 503 && hdr.Get("Retry-After") != "":
				busy++
			default:
				bad = append(bad, fmt.Sprintf("%d %v %.200s", code, err, body))
			}
			return false
		}, func() string { return fmt.Sprintf("(answers: %d×503, others %q)", busy, bad) })
		t.Logf("FIGURE SIGKILL failover: survivor served %v after SIGKILL (target ≤ dead_after %v + 5s); %d×503 before", d, deadAfter, busy)
		if d > deadAfter+5*time.Second {
			t.Errorf("hard failover took %v, target %v", d, deadAfter+5*time.Second)
		}
		if len(bad) > 0 {
			t.Errorf("while the killed box's lease held, answers other than 503 + Retry-After: %q", bad)
		}
	})
}

// TestCloudRegionStampsHomeRegion: a box with LCHAT_CLOUD_REGION gives a space created
// without a home_region that region, so the mesh places it in its region from its first
// wake; an explicit home_region wins, and the peers get the stamped row.
func TestCloudRegionStampsHomeRegion(t *testing.T) {
	c := newCluster(t)
	c.env = []string{"LCHAT_CLOUD_REGION=fi"}
	a := c.start(false)
	c.env = nil
	b := c.start(false)
	harness.WaitFor(t, 5*time.Second, "two live members", func() bool { return len(status(t, a).Mesh.Live) == 2 })
	homeRegion := func(n *node, host string) string {
		var sum struct {
			HomeRegion string `json:"home_region"`
		}
		n.AdminJSON("GET", "/lchat/routes/"+host, nil, 200, &sum)
		return sum.HomeRegion
	}
	a.AdminJSON("POST", "/lchat/routes", map[string]any{"host": "stamped." + meshDomain, "kind": "demo"}, http.StatusCreated, nil)
	a.AdminJSON("POST", "/lchat/routes", map[string]any{"host": "explicit." + meshDomain, "kind": "demo", "home_region": "ie"}, http.StatusCreated, nil)
	if got := homeRegion(a, "stamped."+meshDomain); got != "fi" {
		t.Errorf("home_region of a space created without one = %q, want LCHAT_CLOUD_REGION fi", got)
	}
	if got := homeRegion(a, "explicit."+meshDomain); got != "ie" {
		t.Errorf("explicit home_region = %q, want ie", got)
	}
	harness.WaitFor(t, 5*time.Second, "the stamped row on the peer", func() bool { return hasRoute(b, "stamped."+meshDomain) })
	if got := homeRegion(b, "stamped."+meshDomain); got != "fi" {
		t.Errorf("the peer's copy has home_region %q, want fi", got)
	}
	// A box without LCHAT_CLOUD_REGION stamps nothing.
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": "plain." + meshDomain, "kind": "demo"}, http.StatusCreated, nil)
	if got := homeRegion(b, "plain."+meshDomain); got != "" {
		t.Errorf("home_region on a box without LCHAT_CLOUD_REGION = %q, want none", got)
	}
}
