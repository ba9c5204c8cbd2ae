package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/internal/testnet"
	"github.com/lchat/lchat-caddy/spacestore/pageread/pagereadtest"
)

// dialFromInstance is the test instance's POST /dial?addr=A: one TCP connection to A
// (a banner server), answered as {"ok","out","ms"}.
func dialFromInstance(w http.ResponseWriter, addr string) {
	start := time.Now()
	var res struct {
		OK  bool    `json:"ok"`
		Out string  `json:"out"`
		MS  float64 `json:"ms"`
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 64)
		var n int
		n, err = c.Read(b)
		c.Close()
		res.Out = strings.TrimSpace(string(b[:n]))
	}
	if err != nil {
		res.Out = err.Error()
	}
	res.OK, res.MS = err == nil, time.Since(start).Seconds()*1000
	json.NewEncoder(w).Encode(res)
}

func TestNetworkSettingRefusals(t *testing.T) {
	allow := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	for _, c := range []struct {
		name string
		k    Kind
		want string
	}{
		{"unknown mode", Kind{Network: "private"}, `unknown network "private": none, egress or host`},
		{"allow without egress", Kind{Network: NetworkHost, NetworkAllow: allow}, "network_allow: only network egress takes an allow list"},
		{"allow with the default", Kind{NetworkAllow: allow}, "network_allow: only network egress takes an allow list"},
		{"egress without isolation", Kind{Isolation: IsolationNone, Network: NetworkEgress}, "network egress needs the space's own uid and cgroup: set isolation on, or network host"},
		{"none without isolation", Kind{Isolation: IsolationNone, Network: NetworkNone}, "network none needs the space's own uid and cgroup"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkNetwork(c.k)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("checkNetwork: %v, want %q", err, c.want)
			}
		})
	}
	if os.Geteuid() != 0 {
		// A developer's box: the modes that need capabilities name them; host works.
		if err := checkNetwork(Kind{Network: NetworkEgress}); err == nil || !strings.Contains(err.Error(), "CAP_NET_ADMIN") {
			t.Errorf("network egress without CAP_NET_ADMIN: %v", err)
		}
		if err := checkNetwork(Kind{Network: NetworkNone}); err == nil || !strings.Contains(err.Error(), "CAP_SYS_ADMIN") {
			t.Errorf("network none without CAP_SYS_ADMIN: %v", err)
		}
	}
	for _, k := range []Kind{{}, {Network: NetworkHost}, {Isolation: IsolationNone}, {Isolation: IsolationNone, Network: NetworkHost}} {
		if err := checkNetwork(k); err != nil {
			t.Errorf("checkNetwork(%+v): %v", k, err)
		}
	}
}

func TestParseAllow(t *testing.T) {
	for in, want := range map[string]string{
		"10.1.0.0/16": "10.1.0.0/16", "10.1.2.3": "10.1.2.3/32", "fd12::/16": "fd12::/16", "fd12::7": "fd12::7/128",
		"::ffff:10.1.2.3": "10.1.2.3/32",
	} {
		p, err := ParseAllow(in)
		if err != nil || p.String() != want {
			t.Errorf("ParseAllow(%q) = %v, %v; want %s", in, p, err, want)
		}
	}
	for in, want := range map[string]string{
		"10.1.2.3/16": "did you mean 10.1.0.0/16?", "example.com": "neither an address nor a CIDR range",
		"fe80::1%eth0": "zone", "": "neither",
	} {
		if _, err := ParseAllow(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseAllow(%q): %v, want %q", in, err, want)
		}
	}
}

// inWorld runs the calling test again inside the box namespace of a World it builds
// (root only; the machine's own network is never touched) and reports whether this
// process is that run. The World's servers live in this process, the parent.
func inWorld(t *testing.T) bool {
	t.Helper()
	if os.Getenv("LCHAT_ENGINE_TEST_WORLD") != "" {
		return true
	}
	w := testnet.NewWorld(t)
	w.ServeBanner(t, w.Box, netip.MustParseAddrPort("127.0.0.1:5432"), "loopback")
	args := []string{"-test.run=^" + t.Name() + "$", "-test.count=1", "-test.v"}
	if d, ok := t.Deadline(); ok {
		// The run inside ends before this one's deadline: a run that hangs panics with its
		// own goroutines, logged below, rather than leave go test's timeout a dump of this
		// process, waiting.
		args = append(args, fmt.Sprintf("-test.timeout=%v", max(time.Until(d)-time.Minute, time.Minute)))
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "LCHAT_ENGINE_TEST_WORLD=1")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	// Once the run inside has exited, its output pipe is waited for this long: a process
	// it left behind holding the pipe must not hold this test.
	cmd.WaitDelay = 10 * time.Second
	if err := w.Box.Start(cmd); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	t.Logf("inside %s:\n%s", w.Box.Name, out.String())
	if err != nil {
		t.Fatalf("the run inside the box namespace failed: %v", err)
	}
	if !strings.Contains(out.String(), "--- PASS: "+t.Name()) {
		t.Fatal("the run inside the box namespace did not pass the test (skipped?)")
	}
	return false
}

// networkEngine is an engine whose kinds run a copy of this test binary (reachable by
// the spaces' uids) under isolation, one kind per network setting.
func networkEngine(t *testing.T, kinds map[string]Kind, uidFirst uint32, log *zap.Logger) *Engine {
	t.Helper()
	dir, inst := reachableInstance(t, "net")
	for name, k := range kinds {
		k.Command, k.Env, k.Isolation = inst, map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"}, IsolationOn
		k.Replication, k.StopGrace = Replication{Class: ReplicateSleep}, 5*time.Second
		kinds[name] = k
	}
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Bucket: b, StateDir: filepath.Join(dir, "state"), Holder: "box", Incarnation: "1",
		Kinds: kinds, UIDFirst: uidFirst, UIDCount: 100, Logger: log, PageReader: pagereadtest.Binary(t)})
	if err != nil {
		t.Fatal(err)
	}
	drainAtEnd(t, e)
	return e
}

type dialResult struct {
	OK  bool    `json:"ok"`
	Out string  `json:"out"`
	MS  float64 `json:"ms"`
}

// opTimeout bounds one wake or sleep of these tests: one that never ends fails its test,
// naming the space, rather than hold the package until go test's timeout.
const opTimeout = 2 * time.Minute

// opContext is a context for one wake or sleep (opTimeout), cancelled when t ends.
func opContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

// dialVia wakes host (of kind) and asks its instance to connect to addr.
func dialVia(t *testing.T, e *Engine, host, kind string, addr netip.AddrPort) dialResult {
	t.Helper()
	u, err := e.Acquire(opContext(t), Space{Host: host, Kind: kind})
	if err != nil {
		t.Fatalf("waking %s: %v", host, err)
	}
	defer u.Release()
	c := &http.Client{Timeout: opTimeout, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", u.Socket())
	}}}
	resp, err := c.Post("http://x/dial?"+url.Values{"addr": {addr.String()}}.Encode(), "", nil)
	if err != nil {
		t.Fatalf("%s: %v", host, err)
	}
	defer resp.Body.Close()
	var r dialResult
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestInstanceNetworkByKind wakes one isolated space per network setting and has each
// connect to the box's loopback, the metadata service, a private address, an allowed
// one, the internet and a mesh peer, in a World of the test's own.
func TestInstanceNetworkByKind(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	if !inWorld(t) {
		return
	}
	core, logs := observer.New(zap.InfoLevel)
	e := networkEngine(t, map[string]Kind{
		"host":   {Network: NetworkHost},
		"egress": {}, // unset: an isolated kind defaults to egress
		"allow":  {Network: NetworkEgress, NetworkAllow: []netip.Prefix{testnet.AllowedNet}},
		"none":   {Network: NetworkNone},
	}, 3200600, zap.New(core))
	for _, l := range logs.FilterMessage("kind isolation").All() {
		f := l.ContextMap()
		if want := map[string]string{"host": "host", "egress": "egress", "allow": "egress", "none": "none"}[f["kind"].(string)]; f["network"] != want {
			t.Errorf("kind %s logged network %v, want %s", f["kind"], f["network"], want)
		}
	}
	port := func(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, 80) }
	loop := netip.MustParseAddrPort("127.0.0.1:5432")
	targets := map[string]netip.AddrPort{"loopback": loop, "metadata": port(testnet.Metadata), "private10": port(testnet.Private10),
		"allowed": port(testnet.Allowed), "public": port(testnet.Public4), "peer": port(testnet.Peer)}
	reach := map[string][]string{
		"host":   {"loopback", "metadata", "private10", "allowed", "public", "peer"},
		"egress": {"public", "peer"},
		"allow":  {"allowed", "public", "peer"},
		"none":   nil,
	}
	check := func(reach map[string][]string) {
		t.Helper()
		for kind, ok := range reach {
			for name, addr := range targets {
				r := dialVia(t, e, kind+".example.com", kind, addr)
				switch want := slices.Contains(ok, name); {
				case want && (!r.OK || r.Out != name):
					t.Errorf("network %s: %s (%s): %s, want it reached", kind, name, addr, r.Out)
				case !want && r.OK:
					t.Errorf("network %s: %s (%s) answered %q, want refused", kind, name, addr, r.Out)
				case !want && r.MS > 1000:
					t.Errorf("network %s: %s (%s) failed after %.0f ms (%s), want refused at once", kind, name, addr, r.MS, r.Out)
				}
			}
		}
	}
	check(reach)
	// The mesh peer becomes known: refused to egress instances, still reached by host.
	e.SetNetworkPeers([]netip.Addr{testnet.Peer})
	reach["egress"], reach["allow"] = []string{"public"}, []string{"allowed", "public"}
	check(reach)
}

// TestWakeCostByNetwork measures wakes (lease, restore, start, ready) of isolated spaces
// with isolation alone (network host, the box's /tmp, on an engine that installs no
// egress filter), under network egress and none (on an engine that does), with a private
// /tmp alone, and with all of egress, limits.disk and a private /tmp (the disk mounted by
// the first, warm-up, round and kept), interleaved in one run, and
// logs their p50 and p99: LCHAT_WAKE_COST_ROUNDS=200 go test ./engine -run WakeCost -v
// (root). Without the variable it makes 15 rounds.
func TestWakeCostByNetwork(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	if !inWorld(t) {
		return
	}
	rounds := 15
	if n, err := strconv.Atoi(os.Getenv("LCHAT_WAKE_COST_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	// Each mode's kind is named after it.
	const hostMode, egressMode, noneMode = string(NetworkHost), string(NetworkEgress), string(NetworkNone)
	alone := networkEngine(t, map[string]Kind{hostMode: {Network: NetworkHost, Tmp: TmpHost}}, 3200700, nil)
	confined := networkEngine(t, map[string]Kind{egressMode: {Network: NetworkEgress, Tmp: TmpHost}, noneMode: {Network: NetworkNone, Tmp: TmpHost}}, 3200800, nil)
	if alone.openFirewall() != nil || confined.openFirewall() == nil {
		t.Fatal("the isolation-alone engine has an egress filter, or the confined one has none")
	}
	// A private /tmp hides /tmp, where reachableInstance keeps its engines: these two
	// live outside it.
	const privTmp, full = "tmp", "full"
	tmpOnly, _ := diskEngine(t, nil, map[string]Kind{privTmp: {Network: NetworkHost, Tmp: TmpPrivate}}, 3201000)
	fullEngine, _ := diskEngine(t, nil, map[string]Kind{full: {Network: NetworkEgress, Limits: Limits{DiskBytes: 64 << 20}}}, 3201100)
	if p, why := tmpOnly.privateTmp(tmpOnly.Kinds()[privTmp], true); !p {
		t.Fatalf("the private /tmp engine gives none: %v", why)
	}
	if p, _ := alone.privateTmp(alone.Kinds()[hostMode], true); p {
		t.Fatal("the isolation-alone engine gives a private /tmp")
	}
	modes := []string{hostMode, egressMode, noneMode, privTmp, full}
	engines := map[string]*Engine{hostMode: alone, egressMode: confined, noneMode: confined, privTmp: tmpOnly, full: fullEngine}
	took := map[string][]time.Duration{}
	for i := range rounds + 1 {
		for j := range modes {
			m := modes[(i+j)%len(modes)] // rotate, so no mode always follows another
			e, host := engines[m], m+".example.com"
			start := time.Now()
			u, err := e.Acquire(opContext(t), Space{Host: host, Kind: m})
			d := time.Since(start)
			if err != nil {
				t.Fatalf("waking %s: %v", host, err)
			}
			u.Release()
			if err := e.Sleep(opContext(t), host); err != nil {
				t.Fatal(err)
			}
			if i > 0 { // the first round warms the caches
				took[m] = append(took[m], d)
			}
		}
	}
	if fullEngine.mountedDisk(full+".example.com") == nil {
		t.Fatal("the full engine's space has no disk mounted")
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	pct := func(ds []time.Duration, p float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(len(s)-1, int(float64(len(s))*p))]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "wake cost over %d interleaved rounds:\n", rounds)
	names := map[string]string{hostMode: "isolation on alone", egressMode: "+ network egress", noneMode: "+ network none",
		privTmp: "+ private /tmp", full: "+ egress, disk, private /tmp"}
	for _, m := range modes {
		fmt.Fprintf(&b, "  %-30s p50 %6.2f ms  p99 %6.2f ms\n", names[m], ms(pct(took[m], .5)), ms(pct(took[m], .99)))
	}
	for _, m := range modes[1:] {
		fmt.Fprintf(&b, "  %-30s costs: p50 %+.2f ms, p99 %+.2f ms\n", names[m],
			ms(pct(took[m], .5)-pct(took[hostMode], .5)), ms(pct(took[m], .99)-pct(took[hostMode], .99)))
	}
	t.Log(b.String())
}

// FuzzParseAllow: an accepted entry is a valid, masked prefix that reads back as itself.
func FuzzParseAllow(f *testing.F) {
	for _, s := range []string{"10.1.0.0/16", "10.1.2.3", "fd12::/16", "::ffff:10.1.2.3", "10.1.2.3/16", "fe80::1%eth0", "0.0.0.0/0", "::/0", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseAllow(s)
		if err != nil {
			return
		}
		if !p.IsValid() || p.Masked() != p {
			t.Fatalf("ParseAllow(%q) = %v: not a valid masked prefix", s, p)
		}
		if q, err := ParseAllow(p.String()); err != nil || q != p {
			t.Fatalf("ParseAllow(%q) = %v, which reads back as %v, %v", s, p, q, err)
		}
	})
}
