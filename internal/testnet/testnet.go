// Package testnet builds the network namespaces that tests of the spaces' network run in,
// so that no rule a box loads ever touches the machine's own network: a "box" namespace,
// where the box (and its egress filter) runs, joined by a veth pair to an "outside"
// namespace that stands for everything beyond the box: the internet, the cloud metadata
// service, the private network, the mesh peers, the resolver. It needs root and the ip
// command (iproute2).
package testnet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// NS is one named network namespace (ip netns), removed when the test ends.
type NS struct {
	Name string
}

var seq atomic.Uint64

// New creates a network namespace with its loopback up. It skips the test when not
// root or without the ip command.
func New(t testing.TB, role string) *NS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root (CI runs as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip command (iproute2)")
	}
	n := &NS{Name: fmt.Sprintf("lchat-%s-%d-%d", role, os.Getpid(), seq.Add(1))}
	if out, err := exec.Command("ip", "netns", "add", n.Name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", n.Name, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", n.Name).Run() })
	n.IP(t, "link", "set", "lo", "up")
	return n
}

// Path is the namespace's file.
func (n *NS) Path() string { return "/run/netns/" + n.Name }

// IP runs `ip -n <name> args...`, failing the test on an error.
func (n *NS) IP(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", n.Name}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip -n %s %s: %v: %s", n.Name, strings.Join(args, " "), err, out)
	}
}

// Do runs f on an OS thread inside the namespace: the sockets f creates belong to it,
// and a process f starts begins inside it.
func (n *NS) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer own.Close()
		target, err := os.Open(n.Path())
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering %s: %v", n.Name, err)
			return
		}
		err = f()
		// A thread that cannot go back ends with this goroutine (it stays locked).
		if unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Listen listens inside the namespace.
func (n *NS) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() (err error) { l, err = net.Listen(network, addr); return })
	return l, err
}

// ListenPacket listens for datagrams inside the namespace.
func (n *NS) ListenPacket(network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := n.Do(func() (err error) { c, err = net.ListenPacket(network, addr); return })
	return c, err
}

// DialContext connects from inside the namespace, as the test's own uid.
func (n *NS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() (err error) { c, err = (&net.Dialer{}).DialContext(ctx, network, addr); return })
	return c, err
}

// Start starts cmd inside the namespace.
func (n *NS) Start(cmd *exec.Cmd) error { return n.Do(cmd.Start) }

// Addresses of the World. The outside ones sit on the outside namespace's loopback and
// are reached from the box through its default routes.
var (
	BoxAddr4      = netip.MustParseAddr("203.0.113.2")   // the box's own address on its link
	BoxAddr6      = netip.MustParseAddr("2001:db8:1::2") // the box's own IPv6 address
	gateway4      = netip.MustParseAddr("203.0.113.1")
	gateway6      = netip.MustParseAddr("2001:db8:1::1")
	Metadata      = netip.MustParseAddr("169.254.169.254")    // AWS, GCP, Azure, Oracle
	Metadata6     = netip.MustParseAddr("fd00:ec2::254")      // AWS over IPv6
	MetadataAli   = netip.MustParseAddr("100.100.100.200")    // Alibaba
	Public4       = netip.MustParseAddr("198.51.100.7")       // "the internet"
	Public6       = netip.MustParseAddr("2001:db8:7::7")      // "the internet" over IPv6
	Private10     = netip.MustParseAddr("10.9.9.9")           // a private service
	Private172    = netip.MustParseAddr("172.16.5.5")         // a private service
	Private192    = netip.MustParseAddr("192.168.7.7")        // a private service
	Private6      = netip.MustParseAddr("fd12:3456::7")       // a private IPv6 service
	AllowedNet    = netip.MustParsePrefix("10.77.0.0/24")     // a private range a kind re-opens
	Allowed       = netip.MustParseAddr("10.77.0.5")          // a service in AllowedNet
	Peer          = netip.MustParseAddr("198.51.100.9")       // a mesh peer (a public address)
	NAT64Metadata = netip.MustParseAddr("64:ff9b::a9fe:a9fe") // the metadata service through NAT64
)

// World is a box namespace linked to an outside namespace, with a TCP banner server on
// port 80 at every outside address (answering its name and a newline) and a DNS
// server at the resolver of /etc/resolv.conf.
type World struct {
	Box, Outside *NS
	// Banners maps each outside address to the banner its server answers.
	Banners map[netip.Addr]string
	// Resolver is where the box's resolver (the first nameserver of /etc/resolv.conf,
	// what the box reads) answers inside the world: on the outside's loopback, or on
	// the box's when it is a loopback address. Its names are DNSNames.
	Resolver netip.Addr
}

// DNSNames are the names the World's resolver answers (A records); every other name is
// NXDOMAIN.
var DNSNames = map[string]netip.Addr{"public.lchat.test.": Public4, "peer.lchat.test.": Peer}

// NewWorld builds the namespaces, the link, the addresses, the routes and the servers.
func NewWorld(t testing.TB) *World {
	t.Helper()
	w := &World{Box: New(t, "box"), Outside: New(t, "out"), Banners: map[netip.Addr]string{}}
	if out, err := exec.Command("ip", "link", "add", "vbox", "netns", w.Box.Name, "type", "veth",
		"peer", "name", "vout", "netns", w.Outside.Name).CombinedOutput(); err != nil {
		t.Fatalf("adding the veth pair: %v: %s", err, out)
	}
	w.Box.IP(t, "addr", "add", BoxAddr4.String()+"/24", "dev", "vbox")
	w.Box.IP(t, "addr", "add", BoxAddr6.String()+"/64", "dev", "vbox", "nodad")
	w.Outside.IP(t, "addr", "add", gateway4.String()+"/24", "dev", "vout")
	w.Outside.IP(t, "addr", "add", gateway6.String()+"/64", "dev", "vout", "nodad")
	w.Box.IP(t, "link", "set", "vbox", "up")
	w.Outside.IP(t, "link", "set", "vout", "up")
	w.Box.IP(t, "route", "add", "default", "via", gateway4.String())
	w.Box.IP(t, "-6", "route", "add", "default", "via", gateway6.String())

	for name, a := range map[string]netip.Addr{
		"metadata": Metadata, "metadata6": Metadata6, "metadata-alibaba": MetadataAli,
		"public": Public4, "public6": Public6, "private10": Private10, "private172": Private172,
		"private192": Private192, "private6": Private6, "allowed": Allowed, "peer": Peer,
		"nat64-metadata": NAT64Metadata,
	} {
		w.Outside.addLoopback(t, a)
		w.Banners[a] = name
		w.serveBanner(t, w.Outside, netip.AddrPortFrom(a, 80), name)
	}

	rs, err := readNameservers("/etc/resolv.conf")
	if err != nil || len(rs) == 0 {
		t.Fatalf("no nameserver in /etc/resolv.conf (%v): the box's resolver cannot be stood in for", err)
	}
	w.Resolver = rs[0]
	at := w.Outside
	if w.Resolver.IsLoopback() {
		at = w.Box
	} else if _, ok := w.Banners[w.Resolver]; !ok {
		w.Outside.addLoopback(t, w.Resolver)
	}
	serveDNS(t, at, netip.AddrPortFrom(w.Resolver, 53))
	// A DNS server at a private address that is not the resolver: port 53 is no way
	// through to the private network.
	serveDNS(t, w.Outside, netip.AddrPortFrom(Private10, 53))
	return w
}

// addLoopback puts a on the namespace's loopback, usable at once (no duplicate address
// detection).
func (n *NS) addLoopback(t testing.TB, a netip.Addr) {
	t.Helper()
	args := []string{"addr", "add", netip.PrefixFrom(a, a.BitLen()).String(), "dev", "lo"}
	if a.Is6() {
		args = append(args, "nodad")
	}
	n.IP(t, args...)
}

// serveBanner answers every connection to addr with name and a newline.
func (w *World) serveBanner(t testing.TB, ns *NS, addr netip.AddrPort, name string) {
	t.Helper()
	l, err := ns.Listen("tcp", addr.String())
	if err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(name + "\n"))
			c.Close()
		}
	}()
}

// ServeBanner is serveBanner for the test's own services (a loopback database, a
// service on the box's own address).
func (w *World) ServeBanner(t testing.TB, ns *NS, addr netip.AddrPort, name string) {
	t.Helper()
	w.serveBanner(t, ns, addr, name)
}

func readNameservers(path string) ([]netip.Addr, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for l := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil {
				out = append(out, a.Unmap().WithZone(""))
			}
		}
	}
	return out, nil
}

// Port is the port of a listener's address, as a string.
func Port(l net.Listener) string { return strconv.Itoa(l.Addr().(*net.TCPAddr).Port) }
