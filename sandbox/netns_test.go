package sandbox

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/lchat/lchat-caddy/internal/testnet"
)

// TestEmptyNetworkLeavesOnlyTheInstancesOwnLoopback starts a probe with
// StartOptions.EmptyNetwork from a box in a namespace the test builds: the probe has an
// up loopback of its own and nothing else, while the box's loopback service, the
// metadata service and the internet, all reachable from the box's namespace, are not.
func TestEmptyNetworkLeavesOnlyTheInstancesOwnLoopback(t *testing.T) {
	c := rootCgroups(t)
	if err := CheckEmptyNetwork(); err != nil {
		t.Fatal(err)
	}
	w := testnet.NewWorld(t)
	w.ServeBanner(t, w.Box, netip.MustParseAddrPort("127.0.0.1:5432"), "loopback")
	bin := probeBinary(t)
	targets := []string{"ifaces:", "loopback:127.0.0.1", "loopback:::1", "tcp:127.0.0.1:5432",
		tcp(testnet.Metadata), tcp(testnet.Public4), tcp(testnet.Public6), "dns:" + w.Resolver.String()}

	g, err := c.Create("netns.test", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "SANDBOX_TEST_MODE=netprobe", "SANDBOX_PROBE="+strings.Join(targets, " "))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 3999970, Gid: 3999970, Groups: []uint32{}}}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	// The box runs in the world's box namespace; its forking thread moves on from there.
	var release func()
	if err := w.Box.Do(func() (err error) { release, err = g.Start(cmd, StartOptions{EmptyNetwork: true}); return }); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	release()
	res := map[string]string{}
	for l := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		f := strings.Fields(l)
		if len(f) == 4 {
			res[f[0]] = f[1] + " " + f[2]
		}
	}
	t.Logf("probe in an empty network:\n%s", out.String())
	if got := res["ifaces:"]; got != "ok lo/up+loopback+running" && got != "ok lo/up+loopback" {
		t.Errorf("interfaces %q, want only lo, up", got)
	}
	for _, tg := range []string{"loopback:127.0.0.1", "loopback:::1"} {
		if !strings.HasPrefix(res[tg], "ok self") {
			t.Errorf("%s: %s, want the probe's own listener reached", tg, res[tg])
		}
	}
	for _, tg := range targets[3:] {
		if !strings.HasPrefix(res[tg], "err ") {
			t.Errorf("%s: %s, want unreachable", tg, res[tg])
		}
	}
	// The control: the box's namespace, where the probe was started from, reaches them.
	for tg, r := range probeAs(t, bin, w.Box, 3999970, targets[3:6]...) {
		if !r.ok {
			t.Errorf("control: %s from the box's namespace: %s", tg, r.out)
		}
	}
}

// BenchmarkStartNetwork measures one start and reap of /bin/true in a space's cgroup,
// with and without an empty network namespace, side by side (root):
// go test ./sandbox -run X -bench StartNetwork.
func BenchmarkStartNetwork(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	c, err := OpenCgroups()
	if err != nil {
		b.Skip(err)
	}
	defer c.Close()
	g, err := c.Create("netns.bench", Limits{})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Remove()
	for _, empty := range []bool{false, true} {
		b.Run("empty_network="+map[bool]string{false: "off", true: "on"}[empty], func(b *testing.B) {
			for b.Loop() {
				cmd := exec.Command("/bin/true")
				release, err := g.Start(cmd, StartOptions{EmptyNetwork: empty})
				if err != nil {
					b.Fatal(err)
				}
				cmd.Wait()
				release()
			}
		})
	}
}

// BenchmarkAdmit measures one Admit and its release of a host exception (the per-start
// cost of a kind with network host or an allow list on an egress box).
func BenchmarkAdmit(b *testing.B) {
	f := openIn(b, testnet.New(b, "bench"), 3300000, netip.MustParseAddr("10.0.0.2"))
	for b.Loop() {
		release, err := f.Admit(3300007, Egress{Host: true})
		if err != nil {
			b.Fatal(err)
		}
		release()
	}
}

// BenchmarkOpenFirewall measures installing (and removing) a box's egress table, the
// one-off cost at start-up.
func BenchmarkOpenFirewall(b *testing.B) {
	cfg := nsConfig(b, testnet.New(b, "bench"), 3300000, netip.MustParseAddr("10.0.0.2"))
	for b.Loop() {
		f, err := OpenFirewall(cfg)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}
