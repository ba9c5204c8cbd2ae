package derp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/filestorage"
	_ "github.com/caddyserver/caddy/v2/modules/metrics"
	"tailscale.com/tailcfg"

	"github.com/lchat/lchat-caddy/derpswitch"
	_ "github.com/lchat/lchat-caddy/modules/buckets"
	_ "github.com/lchat/lchat-caddy/modules/certstorage"
	_ "github.com/lchat/lchat-caddy/modules/derpswitch"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// adminClient does not keep connections: a config load replaces the admin server.
var adminClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

// caddyBox runs the derp_switch app in this process through caddy.Load, as
// `lchat-caddy run` would, with file storage in a temp dir.
type caddyBox struct {
	t       *testing.T
	admin   string
	storage string
}

func (c *caddyBox) config(m *tailcfg.DERPMap, drain string) []byte {
	return c.configWith(m, drain, 1, "")
}

// configWith is config with another home_region and extra app fields (",\"k\": v").
func (c *caddyBox) configWith(m *tailcfg.DERPMap, drain string, home int, extra string) []byte {
	mapJSON, _ := json.Marshal(m)
	return []byte(fmt.Sprintf(`{
		"admin": {"listen": %q},
		"storage": {"module": "file_system", "root": %q},
		"apps": {"derp_switch": {
			"derp_map": %s,
			"home_region": %d,
			"drain": %q,
			"prove": {"count": 3, "interval": "50ms", "timeout": "1s"}%s
		}}
	}`, c.admin, c.storage, mapJSON, home, drain, extra))
}

func (c *caddyBox) post(path, body string) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest("POST", "http://"+c.admin+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := adminClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (c *caddyBox) load(cfg []byte) {
	c.t.Helper()
	if err := c.try(cfg); err != nil {
		c.t.Fatalf("loading config: %v", err)
	}
}

// try loads cfg and, whether it was accepted or not, waits until the admin server it
// replaced has closed its listener (see harness.WaitOldAdminClosed).
func (c *caddyBox) try(cfg []byte) error {
	c.t.Helper()
	err := caddy.Load(cfg, true)
	harness.WaitOldAdminClosed(c.t, c.admin, 15*time.Second)
	return err
}

func (c *caddyBox) status() derpswitch.Status {
	c.t.Helper()
	resp, err := adminClient.Get("http://" + c.admin + "/derp_switch/status")
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st derpswitch.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		c.t.Fatal(err)
	}
	return st
}

func (c *caddyBox) pin(region int) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest("POST", "http://"+c.admin+"/derp_switch/settings",
		bytes.NewReader([]byte(fmt.Sprintf(`{"derp_region": %d}`, region))))
	req.Header.Set("Content-Type", "application/json")
	resp, err := adminClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (c *caddyBox) waitHome(region int) {
	c.t.Helper()
	harness.WaitFor(c.t, 10*time.Second, fmt.Sprintf("home region %d", region), func() bool {
		st := c.status()
		return st.HomeRegion == region && st.HomeConnected
	})
}

// TestCaddyPinPersistenceReloadAndClear drives the app through the admin API: unknown
// regions are refused, a pin survives a restart (boot connects straight to it), a
// reload keeps the connections, a changed DERP map reconciles, and clearing the pin
// persists too.
func TestCaddyPinPersistenceReloadAndClear(t *testing.T) {
	regions, m := startRegions(t, 4)
	c := &caddyBox{t: t, admin: harness.FreeAddr(t, "127.0.0.1"), storage: t.TempDir()}
	cfg := c.config(m, "1s")
	c.load(cfg)
	t.Cleanup(func() { caddy.Stop() })
	c.waitHome(1)

	if code, body := c.pin(99); code != http.StatusBadRequest {
		t.Fatalf("pin to unknown region: %d %s; want 400", code, body)
	}
	// Bad requests are refused and change nothing (neither the live pin nor storage).
	for _, body := range []string{`{}`, `{"derp_region": -1}`, `{"derp_region": "2"}`, `{"derp_region": 2.5}`, `{"region": 2}`, `not json`,
		`{"derp_region": 2} {"derp_region": 3}`, `{"derp_region": 2} junk`} {
		if code, resp := c.post("/derp_switch/settings", body); code != http.StatusBadRequest {
			t.Errorf("settings %s: %d %s; want 400", body, code, resp)
		}
	}
	if resp, err := adminClient.Get("http://" + c.admin + "/derp_switch/settings"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET settings: %d; want 405", resp.StatusCode)
	}
	if st := c.status(); st.Override != 0 || st.HomeRegion != 1 || st.Switch.Generation != 0 {
		t.Fatalf("refused requests changed the state: %+v", st)
	}
	if _, err := os.Stat(filepath.Join(c.storage, "derp_switch", "pin.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("refused requests persisted a pin (stat: %v)", err)
	}
	keyFile := filepath.Join(c.storage, "derp_switch", "node_key")
	nodeKey, err := os.ReadFile(keyFile)
	if err != nil || len(nodeKey) == 0 {
		t.Fatalf("node key not in storage: %v", err)
	}
	if fi, _ := os.Stat(keyFile); fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("node key file mode %v; want it private to the owner", fi.Mode().Perm())
	}
	if code, body := c.pin(3); code != http.StatusOK {
		t.Fatalf("pin 3: %d %s", code, body)
	}
	c.waitHome(3)
	st := c.status()
	if st.Override != 3 || st.PinPending || st.PinMBBCommits != 1 || st.DERPReconnects != 0 {
		t.Fatalf("after pin: %+v", st)
	}
	harness.WaitFor(t, 5*time.Second, "the old home drained", func() bool { return drained(c.status()) })

	// The counters are Prometheus metrics too.
	resp, err := adminClient.Get("http://" + c.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	st = c.status()
	for name, v := range map[string]uint64{
		"pin_mbb_requests": st.PinMBBRequests, "pin_mbb_commits": st.PinMBBCommits,
		"pin_mbb_retries": st.PinMBBRetries, "derp_reconnects": st.DERPReconnects,
		"rehome_applied": st.RehomeApplied, "rollbacks": st.Rollbacks,
	} {
		line := fmt.Sprintf("lchat_derp_switch_%s_total %d\n", name, v)
		if !strings.Contains(string(metrics), line) {
			t.Errorf("metrics lack %q (status has %d):\n%s", strings.TrimSpace(line), v, harness.GrepLines(string(metrics), "lchat_derp_switch"))
		}
	}
	if !strings.Contains(string(metrics), "lchat_derp_switch_pin_mbb_commits_total 1\n") {
		t.Errorf("metrics lack pin_mbb_commits_total 1")
	}

	// Reload with the same identity and map: same engine, no new connection.
	accepted3 := regions[2].proxy.accepted.Load()
	c.load(c.config(m, "2s"))
	time.Sleep(300 * time.Millisecond)
	st = c.status()
	if st.HomeRegion != 3 || !st.HomeConnected || st.PinMBBCommits != 1 || st.DERPReconnects != 0 {
		t.Fatalf("after reload: %+v", st)
	}
	if got := regions[2].proxy.accepted.Load(); got != accepted3 {
		t.Fatalf("reload opened %d new connection(s) to the home region", got-accepted3)
	}

	// A changed DERP map (region 4 removed) reconciles; the home is untouched.
	m2 := &tailcfg.DERPMap{Regions: map[int]*tailcfg.DERPRegion{}}
	for id, r := range m.Regions {
		if id != 4 {
			m2.Regions[id] = r
		}
	}
	c.load(c.config(m2, "2s"))
	if code, _ := c.pin(4); code != http.StatusBadRequest {
		t.Fatalf("pin to a region removed by reload: %d; want 400", code)
	}
	if got := regions[2].proxy.accepted.Load(); got != accepted3 {
		t.Fatalf("map change reconnected the home")
	}

	// A reload that names a home region outside the map, or a retry backoff of zero
	// (a reconnect storm), is refused; the running box is untouched.
	for _, bad := range [][]byte{
		c.configWith(m2, "2s", 9, ""),
		c.configWith(m2, "2s", 1, `, "retry_backoff": [0]`),
	} {
		if err := c.try(bad); err == nil {
			t.Fatalf("bad config accepted:\n%s", bad)
		}
	}
	st = c.status()
	if st.HomeRegion != 3 || !st.HomeConnected || st.Override != 3 || st.DERPReconnects != 0 {
		t.Fatalf("after refused reloads: %+v", st)
	}
	if got := regions[2].proxy.accepted.Load(); got != accepted3 {
		t.Fatalf("a refused reload reconnected the home")
	}

	// A reload that fails after derp_switch started (here: the http app cannot bind a
	// port that is taken) leaves the previous config running: the admin endpoints keep
	// serving it, with its settings (mode mbb), not the failed config's (legacy).
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	failing := bytes.Replace(c.configWith(m2, "2s", 1, `, "mode": "legacy"`), []byte(`"apps": {`),
		[]byte(fmt.Sprintf(`"apps": {"http": {"servers": {"s": {"listen": [%q]}}}, `, taken.Addr().String())), 1)
	for try := 0; try < 6; try++ { // apps start in random order: derp_switch first about half the time
		if err := c.try(failing); err == nil {
			t.Fatal("config with a taken port accepted")
		}
		st = c.status()
		if st.Mode != derpswitch.ModeMBB || st.HomeRegion != 3 || !st.HomeConnected || st.DERPReconnects != 0 {
			t.Fatalf("after a reload that failed to start (try %d): %+v", try, st)
		}
	}
	if code, body := c.pin(3); code != http.StatusOK {
		t.Fatalf("pin after failed reloads: %d %s", code, body)
	}

	// Restart: boot connects straight to the persisted pin, never to home_region 1.
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	accepted1 := regions[0].proxy.accepted.Load()
	c.load(cfg)
	c.waitHome(3)
	st = c.status()
	if st.Override != 3 || st.RehomeApplied != 0 || st.PinMBBRequests != 0 {
		t.Fatalf("after restart: %+v", st)
	}
	if got := regions[0].proxy.accepted.Load(); got != accepted1 {
		t.Fatalf("boot with a pin connected to the default home first")
	}
	if again, err := os.ReadFile(keyFile); err != nil || !bytes.Equal(again, nodeKey) {
		t.Fatalf("node key changed across a restart (err %v)", err)
	}

	// Clear the pin: persisted as cleared; the home stays until something moves it.
	if code, body := c.pin(0); code != http.StatusOK {
		t.Fatalf("clear: %d %s", code, body)
	}
	if st := c.status(); st.Override != 0 || st.PinPending {
		t.Fatalf("after clear: %+v", st)
	}
	caddy.Stop()
	c.load(cfg)
	c.waitHome(1)
	if st := c.status(); st.Override != 0 {
		t.Fatalf("cleared pin came back after restart: %+v", st)
	}
}

// TestNodeKeyStaysOnTheBox: with a storage every box shares (caddy.storage.lchat on the
// fleet's bucket, LCHAT_CERT_CACHE=s3), the node key and the pin stay in this box's data
// directory, so two boxes never load one DERP identity or overwrite each other's pin. An
// explicit `storage` on the app wins over both.
func TestNodeKeyStaysOnTheBox(t *testing.T) {
	_, m := startRegions(t, 2)
	mapJSON, _ := json.Marshal(m)
	data := t.TempDir()
	t.Setenv("XDG_DATA_HOME", data)
	bucketDir := t.TempDir()
	admin := harness.FreeAddr(t, "127.0.0.1")
	load := func(extra string) {
		t.Helper()
		cfg := fmt.Sprintf(`{
			"admin": {"listen": %q},
			"storage": {"module": "lchat", "bucket": {"backend": "file", "root": %q}},
			"apps": {"derp_switch": {"derp_map": %s, "home_region": 1%s}}
		}`, admin, bucketDir, mapJSON, extra)
		if err := caddy.Load([]byte(cfg), true); err != nil {
			t.Fatalf("loading config: %v", err)
		}
		harness.WaitOldAdminClosed(t, admin, 15*time.Second)
	}
	load("")
	t.Cleanup(func() { caddy.Stop() })
	if _, err := os.Stat(filepath.Join(data, "caddy", "derp_switch", "node_key")); err != nil {
		t.Fatalf("node key not in this box's data directory: %v", err)
	}
	filepath.WalkDir(bucketDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.Contains(p, "derp_switch") {
			t.Errorf("per-box DERP state in the shared bucket: %s", p)
		}
		return nil
	})

	own := t.TempDir()
	load(fmt.Sprintf(`, "storage": {"module": "file_system", "root": %q}`, own))
	if _, err := os.Stat(filepath.Join(own, "derp_switch", "node_key")); err != nil {
		t.Fatalf("explicit storage not used for the node key: %v", err)
	}
}

// TestCaddyReloadDroppingPinnedRegion: a reload whose DERP map no longer has the pinned
// region clears the pin in memory and in storage, and the pin's switch in flight never
// commits; a later reload that brings the region back, and a restart, leave the home
// where it is instead of reviving the old pin.
func TestCaddyReloadDroppingPinnedRegion(t *testing.T) {
	regions, m := startRegions(t, 4)
	c := &caddyBox{t: t, admin: harness.FreeAddr(t, "127.0.0.1"), storage: t.TempDir()}
	cfg := c.config(m, "1s")
	c.load(cfg)
	t.Cleanup(func() { caddy.Stop() })
	c.waitHome(1)

	regions[3].proxy.SetDelay(1500 * time.Millisecond) // the switch to 4 is still opening at the reload
	if code, body := c.pin(4); code != http.StatusOK {
		t.Fatalf("pin 4: %d %s", code, body)
	}
	harness.WaitFor(t, 5*time.Second, "switch to 4 opening", func() bool {
		st := c.status()
		return st.Switch.Target == 4 && st.Switch.State == derpswitch.StateAuxOpening
	})
	m2 := &tailcfg.DERPMap{Regions: map[int]*tailcfg.DERPRegion{}}
	for id, r := range m.Regions {
		if id != 4 {
			m2.Regions[id] = r
		}
	}
	c.load(c.config(m2, "1s"))
	time.Sleep(2500 * time.Millisecond) // past region 4's delayed open
	st := c.status()
	if st.Override != 0 || st.HomeRegion != 1 || !st.HomeConnected || st.MBBCommits != 0 {
		t.Fatalf("after the reload dropped the pinned region: %+v", st)
	}
	stored, err := os.ReadFile(filepath.Join(c.storage, "derp_switch", "pin.json"))
	if err != nil || !bytes.Contains(stored, []byte(`"derp_region":0`)) {
		t.Fatalf("stored pin %s (err %v); want it cleared", stored, err)
	}

	// The region comes back in a later reload: the cleared pin stays cleared.
	regions[3].proxy.SetDelay(0)
	c.load(cfg)
	time.Sleep(300 * time.Millisecond)
	if st := c.status(); st.Override != 0 || st.HomeRegion != 1 {
		t.Fatalf("after the region came back: %+v", st)
	}
	caddy.Stop()
	accepted4 := regions[3].proxy.accepted.Load()
	c.load(cfg)
	c.waitHome(1)
	if st := c.status(); st.Override != 0 || regions[3].proxy.accepted.Load() != accepted4 {
		t.Fatalf("restart revived the cleared pin: %+v", st)
	}
}
