package sandbox

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/lchat/lchat-caddy/internal/testnet"
)

// netProbe is the instance of the firewall tests: one line per target, "<target> ok
// <answer> <ms>" or "<target> err <error> <ms>". A target is tcp:<addr:port> (connect
// and read the banner), dns:<addr> (ask for public.lchat.test over UDP), udp:<addr:port>
// (send a datagram), loopback:<127.0.0.1|::1> (connect to a listener of its own there)
// or ifaces: (list the interfaces).
func netProbe(targets []string) {
	for _, tg := range targets {
		kind, addr, _ := strings.Cut(tg, ":")
		start := time.Now()
		out, err := probe(kind, addr)
		ms := time.Since(start).Seconds() * 1000
		if err != nil {
			fmt.Printf("%s err %s %.1f\n", tg, strings.ReplaceAll(err.Error(), " ", "_"), ms)
		} else {
			fmt.Printf("%s ok %s %.1f\n", tg, out, ms)
		}
	}
}

func probe(kind, addr string) (string, error) {
	switch kind {
	case "tcp":
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 64)
		n, err := c.Read(b)
		return strings.TrimSpace(string(b[:n])), err
	case "udp":
		c, err := net.DialTimeout("udp", addr, 5*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return "sent", err
	case "loopback":
		// A listener of the probe's own, on its loopback (addr is 127.0.0.1 or ::1).
		l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
		if err != nil {
			return "", err
		}
		defer l.Close()
		go func() {
			if c, err := l.Accept(); err == nil {
				c.Write([]byte("self\n"))
				c.Close()
			}
		}()
		return probe("tcp", l.Addr().String())
	case "ifaces":
		ifs, err := net.Interfaces()
		var names []string
		for _, i := range ifs {
			names = append(names, i.Name+"/"+strings.ReplaceAll(i.Flags.String(), "|", "+"))
		}
		return strings.Join(names, ","), err
	case "dns":
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "udp", net.JoinHostPort(addr, "53"))
		}}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		as, err := r.LookupHost(ctx, "public.lchat.test")
		return strings.Join(as, ","), err
	}
	return "", fmt.Errorf("unknown probe %q", kind)
}

type probeResult struct {
	ok  bool
	out string
	ms  float64
}

// probeAs runs the probe binary under uid in ns and returns its results by target.
func probeAs(t *testing.T, bin string, ns *testnet.NS, uid uint32, targets ...string) map[string]probeResult {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "SANDBOX_TEST_MODE=netprobe", "SANDBOX_PROBE="+strings.Join(targets, " "))
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := ns.Start(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("probe as uid %d: %v\n%s", uid, err, out.String())
	}
	res := map[string]probeResult{}
	for l := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 {
			t.Fatalf("probe output %q", l)
		}
		ms, _ := strconv.ParseFloat(f[3], 64)
		res[f[0]] = probeResult{ok: f[1] == "ok", out: f[2], ms: ms}
	}
	return res
}

func probeBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fwprobe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o711)
	bin, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "probe")
	if err := os.WriteFile(p, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func tcp(a netip.Addr) string { return "tcp:" + netip.AddrPortFrom(a, 80).String() }

// nsConfig is the firewall config of the uids [first, first+100) in ns, resolving
// through resolver.
func nsConfig(t testing.TB, ns *testnet.NS, first uint32, resolver netip.Addr) FirewallConfig {
	t.Helper()
	fd, err := os.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fd.Close() })
	return FirewallConfig{UIDFirst: first, UIDCount: 100, Resolvers: []netip.Addr{resolver}, NetNS: int(fd.Fd())}
}

// openIn installs a firewall of nsConfig, closed when the test ends.
func openIn(t testing.TB, ns *testnet.NS, first uint32, resolver netip.Addr) *Firewall {
	t.Helper()
	f, err := OpenFirewall(nsConfig(t, ns, first, resolver))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestFirewallRefusesTheBoxAndPrivateRangesAtOnce runs probes, in a namespace the test
// builds (never the machine's own network), as a space's uid under each kind of
// admission and as the box's own uid.
func TestFirewallRefusesTheBoxAndPrivateRangesAtOnce(t *testing.T) {
	w := testnet.NewWorld(t)
	bin := probeBinary(t)
	w.ServeBanner(t, w.Box, netip.MustParseAddrPort("127.0.0.1:5432"), "loopback")
	w.ServeBanner(t, w.Box, netip.MustParseAddrPort("[::1]:5432"), "loopback6")
	w.ServeBanner(t, w.Box, netip.AddrPortFrom(testnet.BoxAddr4, 8080), "boxaddr")
	w.ServeBanner(t, w.Box, netip.AddrPortFrom(testnet.BoxAddr6, 8080), "boxaddr6")

	const first = 3300000
	space, other, outside := uint32(first+7), uint32(first+8), uint32(3400000)
	refused := []string{
		"tcp:127.0.0.1:5432", "tcp:[::1]:5432", "tcp:" + netip.AddrPortFrom(testnet.BoxAddr4, 8080).String(),
		"tcp:" + netip.AddrPortFrom(testnet.BoxAddr6, 8080).String(),
		tcp(testnet.Metadata), tcp(testnet.Metadata6), tcp(testnet.MetadataAli), tcp(testnet.NAT64Metadata),
		tcp(testnet.Private10), tcp(testnet.Private172), tcp(testnet.Private192), tcp(testnet.Private6),
		tcp(testnet.Allowed), "udp:" + netip.AddrPortFrom(testnet.Private10, 9).String(), "dns:" + testnet.Private10.String(),
	}
	reached := []string{tcp(testnet.Public4), tcp(testnet.Public6), "dns:" + w.Resolver.String()}
	all := append(append([]string{}, refused...), reached...)

	// Before any table: every target answers, so each refusal below is the table's.
	for tg, r := range probeAs(t, bin, w.Box, space, all...) {
		if !r.ok && !strings.HasPrefix(tg, "udp:") {
			t.Fatalf("without the table, %s failed (%s): the world is broken", tg, r.out)
		}
	}

	f := openIn(t, w.Box, first, w.Resolver)
	check := func(who string, uid uint32, refused, reached []string) {
		t.Helper()
		res := probeAs(t, bin, w.Box, uid, append(append([]string{}, refused...), reached...)...)
		for _, tg := range refused {
			if r := res[tg]; r.ok || r.ms > 1000 {
				t.Errorf("%s: %s: ok=%v %s in %.1f ms, want refused at once", who, tg, r.ok, r.out, r.ms)
			}
		}
		for _, tg := range reached {
			if r := res[tg]; !r.ok {
				t.Errorf("%s: %s: %s, want it reached", who, tg, r.out)
			}
		}
	}
	check("a space's uid", space, refused, reached)
	var tcps []string
	for _, tg := range all {
		if strings.HasPrefix(tg, "tcp:") {
			tcps = append(tcps, tg)
		}
	}
	check("the box's uid (the positive control)", 0, nil, tcps)
	check("a uid outside the range, never admitted", outside, nil, []string{tcp(testnet.Metadata)})

	// Exceptions: host, an allow list; each release filters the uid again.
	release, err := f.Admit(space, Egress{Host: true})
	if err != nil {
		t.Fatal(err)
	}
	check("a space admitted as host", space, nil, []string{tcp(testnet.Metadata), "tcp:127.0.0.1:5432"})
	check("another space meanwhile", other, []string{tcp(testnet.Metadata)}, nil)
	release()
	check("a space after its host release", space, []string{tcp(testnet.Metadata)}, nil)

	release, err = f.Admit(space, Egress{Allow: []netip.Prefix{testnet.AllowedNet}})
	if err != nil {
		t.Fatal(err)
	}
	check("a space allowed "+testnet.AllowedNet.String(), space, []string{tcp(testnet.Private10), tcp(testnet.Metadata)},
		[]string{tcp(testnet.Allowed), tcp(testnet.Public4)})
	release()
	check("a space after its allow release", space, []string{tcp(testnet.Allowed)}, nil)

	// A uid outside the range (kept from an earlier uid_range) is filtered once admitted,
	// and stays filtered after its release.
	release, err = f.Admit(outside, Egress{})
	if err != nil {
		t.Fatal(err)
	}
	check("an admitted uid outside the range", outside, []string{tcp(testnet.Metadata)}, []string{tcp(testnet.Public4)})
	release()
	check("a uid outside the range after its release", outside, []string{tcp(testnet.Metadata)}, nil)

	// Mesh peers: a public address, refused once it is a peer.
	check("a space before the peer is known", space, nil, []string{tcp(testnet.Peer)})
	if err := f.SetPeers([]netip.Addr{testnet.Peer}); err != nil {
		t.Fatal(err)
	}
	check("a space once the peer is known", space, []string{tcp(testnet.Peer)}, []string{tcp(testnet.Public4)})
	if err := f.SetPeers(nil); err != nil {
		t.Fatal(err)
	}
	check("a space after the peer left", space, nil, []string{tcp(testnet.Peer)})

	// Close removes the table: the space reaches everything again.
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	check("a space after Close", space, nil, []string{tcp(testnet.Metadata)})
}

// TestOpenFirewallReplacesTablesOfDeadBoxes: a box killed with -9 leaves its table; the
// next box's start removes it, and leaves a live box's.
func TestOpenFirewallReplacesTablesOfDeadBoxes(t *testing.T) {
	w := testnet.NewWorld(t)
	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	fd, err := os.Open(w.Box.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(fd.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	staleName := fmt.Sprintf("lchat_%d_1", dead.Process.Pid)
	liveName := fmt.Sprintf("lchat_%d_1", os.Getppid())
	for _, n := range []string{staleName, liveName} {
		conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: n})
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	f := openIn(t, w.Box, 3300000, w.Resolver)
	names := map[string]bool{}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		names[tb.Name] = true
	}
	if names[staleName] || !names[liveName] || !names[f.Name()] {
		t.Fatalf("tables after the start: %v; want %s gone, %s (a live box's) and %s kept", names, staleName, liveName, f.Name())
	}
	f.Close()
	tables, _ = conn.ListTablesOfFamily(nftables.TableFamilyINet)
	for _, tb := range tables {
		if tb.Name == f.Name() {
			t.Fatalf("table %s still there after Close", f.Name())
		}
	}
}

func TestReadResolvers(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "resolv.conf")
	os.WriteFile(p, []byte("# comment\nsearch example.com\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\nnameserver 10.0.0.2\noptions ndots:2\nnameserver bogus\n"), 0o644)
	got, err := ReadResolvers(p)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[10.0.0.2 fe80::1]" {
		t.Errorf("resolvers %v, want [10.0.0.2 fe80::1]", got)
	}
	os.WriteFile(p, []byte("search example.com\n"), 0o644)
	if got, _ := ReadResolvers(p); fmt.Sprint(got) != "[127.0.0.1 ::1]" {
		t.Errorf("resolvers of a file naming none: %v, want the loopback default", got)
	}
	if got, _ := ReadResolvers(filepath.Join(dir, "missing")); fmt.Sprint(got) != "[127.0.0.1 ::1]" {
		t.Errorf("resolvers without a file: %v, want the loopback default", got)
	}
}

func TestDeniedPrefixesCoverTheMetadataAddresses(t *testing.T) {
	for _, s := range []string{"169.254.169.254", "169.254.169.253", "100.100.100.200", "fd00:ec2::254", "fe80::1", "::1",
		"127.0.0.1", "10.1.2.3", "172.31.255.255", "192.168.0.1", "64:ff9b::a9fe:a9fe", "64:ff9b::a00:1", "0.0.0.0", "::", "255.255.255.255", "224.0.0.251", "ff02::fb"} {
		a := netip.MustParseAddr(s)
		hit := false
		for _, p := range deniedPrefixes {
			hit = hit || p.Contains(a)
		}
		if !hit {
			t.Errorf("%s is not denied", s)
		}
	}
	for _, s := range []string{"198.51.100.7", "8.8.8.8", "2001:db8:7::7", "2606:4700::1111", "64:ff9b::808:808", "172.32.0.1", "100.128.0.1"} {
		a := netip.MustParseAddr(s)
		for _, p := range deniedPrefixes {
			if p.Contains(a) {
				t.Errorf("%s, a public address, is denied by %s", s, p)
			}
		}
	}
}
