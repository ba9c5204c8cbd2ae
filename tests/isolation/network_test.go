package isolation

import (
	"context"
	"encoding/json"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/internal/testnet"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// netCaddyfile is a box of the network tests: its admin API on TCP localhost:2019 (as in
// dev), one attacker kind per network setting (netKinds: the kind's name and its network
// lines).
func netCaddyfile() string {
	var kinds strings.Builder
	for _, k := range netKinds {
		kinds.WriteString("\t\tkind " + k[0] + " {\n\t\t\tcommand {$ATTACKER}\n\t\t\tisolation on\n" + k[1] +
			"\t\t\tready_path /healthz\n\t\t\tstop_grace 2s\n\t\t\treplication sleep\n\t\t}\n")
	}
	return `{
	admin {$LCHAT_ADMIN_LISTEN}
	http_port {$HTTP_PORT}
	auto_https off
	storage file_system {$DIR}/state/caddy
	lchat {
		bucket file {$DIR}/bucket
		state_dir {$DIR}/state/spaces
		registry {$DIR}/state/registry.db
		uid_range 3100000 10000
		mesh {
			beat 1s
			dead_after 10m
		}
` + kinds.String() + `	}
}

http:// {
	lchat
}
`
}

var netKinds = [][2]string{
	{"egress", "\t\t\tnetwork egress\n"},
	{"unset", ""},
	{"allowed", "\t\t\tnetwork egress {\n\t\t\t\tallow {$ALLOWED}\n\t\t\t}\n"},
	{"none", "\t\t\tnetwork none\n"},
	{"host", "\t\t\tnetwork host\n"},
}

const adminPort = "127.0.0.1:2019"

// startNetBox builds a World (a box namespace and the outside, both the test's own: the
// machine's network is never touched), the services the attacker aims at inside the box
// namespace, and a box there with one space per kind.
func startNetBox(t *testing.T, env ...string) (*testnet.World, *box) {
	t.Helper()
	needRoot(t)
	w := testnet.NewWorld(t)
	// Services of the box's own: a database on its loopback, something on its address.
	for addr, name := range map[string]string{
		"127.0.0.1:5432": "loopback", "[::1]:5432": "loopback6",
		netip.AddrPortFrom(testnet.BoxAddr4, 8080).String(): "boxaddr", netip.AddrPortFrom(testnet.BoxAddr6, 8080).String(): "boxaddr6",
	} {
		w.ServeBanner(t, w.Box, netip.MustParseAddrPort(addr), name)
	}
	env = append(env, "ATTACKER="+attackerBinary(t), "ALLOWED="+testnet.AllowedNet.String())
	b := startBoxWith(t, boxOptions{ns: w.Box, adminTCP: adminPort}, netCaddyfile(), env...)
	for _, k := range netKinds {
		b.mustAdmin("POST", "/lchat/routes", map[string]any{"host": k[0] + ".localhost", "kind": k[0], "hibernate": true}, nil)
	}
	return w, b
}

func connect(t *testing.T, b *box, host, network, addr string) attempt {
	t.Helper()
	return b.try(host, "connect", url.Values{"addr": {addr}, "net": {network}})
}

// TestInstanceNetwork: an attacker under each network setting tries the box's admin
// port, another loopback service, the box's other addresses, the metadata services, the
// private ranges, a DNS server that is not the resolver, the resolver and the internet.
func TestInstanceNetwork(t *testing.T) {
	w, b := startNetBox(t)
	at := func(a netip.Addr) string { return netip.AddrPortFrom(a, 80).String() }
	boxOwn := map[string]string{
		"the admin API": adminPort, "a loopback service": "127.0.0.1:5432", "a loopback service on ::1": "[::1]:5432",
		"the box's address":      netip.AddrPortFrom(testnet.BoxAddr4, 8080).String(),
		"the box's IPv6 address": netip.AddrPortFrom(testnet.BoxAddr6, 8080).String(),
	}
	metadataAndPrivate := map[string]string{
		"the metadata service": at(testnet.Metadata), "AWS's IPv6 metadata": at(testnet.Metadata6),
		"Alibaba's metadata": at(testnet.MetadataAli), "the metadata service through NAT64": at(testnet.NAT64Metadata),
		"10.0.0.0/8": at(testnet.Private10), "172.16.0.0/12": at(testnet.Private172), "192.168.0.0/16": at(testnet.Private192),
		"fc00::/7": at(testnet.Private6), "a private address another kind allows": at(testnet.Allowed),
	}
	public := map[string]string{"the internet": at(testnet.Public4), "the internet over IPv6": at(testnet.Public6)}

	// The positive control: the box's own uid, in the box's namespace, reaches them all.
	for what, addr := range merge(boxOwn, metadataAndPrivate, public) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := w.Box.DialContext(ctx, "tcp", addr)
		cancel()
		if err != nil {
			t.Fatalf("control: the box's uid cannot reach %s (%s): %v; the refusals below would prove nothing", what, addr, err)
		}
		c.Close()
	}

	refusedAtOnce := func(kind, what, network, addr string) {
		t.Helper()
		a := connect(t, b, kind+".localhost", network, addr)
		switch {
		case a.OK:
			t.Errorf("network %s: %s (%s %s) reached (%q), want refused", kind, what, network, addr, a.Out)
		case a.MS > 1000:
			t.Errorf("network %s: %s (%s %s) failed after %.0f ms (%s), want refused at once, not timed out", kind, what, network, addr, a.MS, a.Err)
		}
	}
	reached := func(kind, what, addr, banner string) {
		t.Helper()
		a := connect(t, b, kind+".localhost", "tcp", addr)
		if !a.OK || banner != "" && a.Out != banner {
			t.Errorf("network %s: %s (%s): %+v, want it reached", kind, what, addr, a)
		}
	}
	banner := func(addr string) string { return w.Banners[netip.MustParseAddrPort(addr).Addr()] }

	for _, kind := range []string{"egress", "unset", "allowed", "none"} {
		for what, addr := range merge(boxOwn, metadataAndPrivate) {
			if kind == "allowed" && addr == at(testnet.Allowed) {
				continue
			}
			refusedAtOnce(kind, what, "tcp", addr)
		}
		refusedAtOnce(kind, "UDP to a private address", "udp", netip.AddrPortFrom(testnet.Private10, 9).String())
		// Port 53 is open to the resolver only, not to any private address.
		a := b.try(kind+".localhost", "resolve", url.Values{"name": {"public.lchat.test"}, "server": {testnet.Private10.String()}})
		if a.OK || a.MS > 1000 {
			t.Errorf("network %s: DNS to %s, not the resolver: %+v, want refused at once", kind, testnet.Private10, a)
		}
	}
	for _, kind := range []string{"egress", "unset", "allowed"} {
		for what, addr := range public {
			reached(kind, what, addr, banner(addr))
		}
		if a := b.try(kind+".localhost", "resolve", url.Values{"name": {"public.lchat.test"}}); !a.OK || a.Out != testnet.Public4.String() {
			t.Errorf("network %s: DNS through the box's resolver (%s): %+v, want %s", kind, w.Resolver, a, testnet.Public4)
		}
	}
	reached("allowed", "the range it allows", at(testnet.Allowed), "allowed")
	for what, addr := range public {
		refusedAtOnce("none", what, "tcp", addr)
	}
	if a := b.try("none.localhost", "resolve", url.Values{"name": {"public.lchat.test"}}); a.OK {
		t.Errorf("network none resolved a name: %+v", a)
	}
	if a := b.try("none.localhost", "interfaces", nil); a.Out != "lo" {
		t.Errorf("network none: interfaces %q, want only lo", a.Out)
	}
	// Host is today's behaviour: the space's uid reaches all of it.
	for what, addr := range merge(boxOwn, metadataAndPrivate, public) {
		reached("host", what, addr, "")
	}

	// The box's log says how each kind runs; an unset network on an isolated kind is egress.
	logs := b.logs.String()
	for kind, want := range map[string]string{"egress": "egress", "unset": "egress", "allowed": "egress", "none": "none", "host": "host"} {
		if !logSays(logs, "kind isolation", map[string]string{"kind": kind, "network": want}) {
			t.Errorf("the box's log does not say kind %s runs with network %s", kind, want)
		}
	}
}

// TestMeshPeersRefusedToEgress: a mesh peer's address is public, so only the mesh
// membership can name it; once the peer's heartbeat is in the bucket, an egress space
// cannot reach it, while a host space still can.
func TestMeshPeersRefusedToEgress(t *testing.T) {
	w, b := startNetBox(t, mesh.EnvSelf+"=http://"+netip.AddrPortFrom(testnet.BoxAddr4, 80).String(),
		mesh.EnvDomains+"=localhost", mesh.EnvToken+"=network-test-mesh-token-0123456789abcdef")
	peer := netip.AddrPortFrom(testnet.Peer, 80).String()
	if a := connect(t, b, "egress.localhost", "tcp", peer); !a.OK || a.Out != "peer" {
		t.Fatalf("before the peer joins, its address is just the internet: %+v", a)
	}
	// The peer's SELF is a name the box resolves through its resolver; it is draining,
	// so the box never places a space there.
	bkt, err := filebucket.New(b.dir + "/bucket")
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := json.Marshal(mesh.Heartbeat{Domains: []string{"localhost"}, Incarnation: "peer-1", Version: "test", Draining: true})
	if _, err := bkt.Put(context.Background(), mesh.HeartbeatKey("https://peer.lchat.test"), strings.NewReader(string(hb)), int64(len(hb)), bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 30*time.Second, "the peer's address refused to the egress space", func() bool {
		a := connect(t, b, "egress.localhost", "tcp", peer)
		return !a.OK && a.MS < 1000
	})
	if a := connect(t, b, "host.localhost", "tcp", peer); !a.OK || a.Out != "peer" {
		t.Errorf("network host and the peer: %+v, want it reached", a)
	}
	if a := connect(t, b, "egress.localhost", "tcp", netip.AddrPortFrom(testnet.Public4, 80).String()); !a.OK || a.Out != w.Banners[testnet.Public4] {
		t.Errorf("the egress space lost the internet with the peer: %+v", a)
	}
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// logSays reports whether a JSON log line with msg has all of fields.
func logSays(logs, msg string, fields map[string]string) bool {
	for l := range strings.SplitSeq(logs, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil || m["msg"] != msg {
			continue
		}
		ok := true
		for k, v := range fields {
			ok = ok && m[k] == v
		}
		if ok {
			return true
		}
	}
	return false
}
