package mesh

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

func TestPeerAddrs(t *testing.T) {
	names := map[string][]netip.Addr{
		"box-2.example.net": {netip.MustParseAddr("203.0.113.20"), netip.MustParseAddr("2001:db8::20")},
	}
	failing := false
	lookup := func(_ context.Context, host string) ([]netip.Addr, error) {
		if failing {
			return nil, errors.New("resolver down")
		}
		return append([]netip.Addr{}, names[host]...), nil
	}
	members := []Member{
		{Self: "https://box-1.example.net", Address: "198.51.100.1"}, // this box: a name nobody resolves, its address
		{Self: "https://box-2.example.net:8443"},
		{Self: "http://[2001:db8::30]:8080", Address: "::ffff:198.51.100.30"},
		{Self: "https://198.51.100.40"},
		{Self: "https://box-2.example.net"}, // the same name twice: one set of addresses
	}
	got, prev := PeerAddrs(context.Background(), members, lookup, nil)
	want := "[198.51.100.1 198.51.100.30 198.51.100.40 203.0.113.20 2001:db8::20 2001:db8::30]"
	if fmt.Sprint(got) != want {
		t.Fatalf("PeerAddrs = %v, want %s", got, want)
	}
	// The resolver fails: the name keeps what it resolved to, so no peer opens up.
	failing = true
	got, _ = PeerAddrs(context.Background(), members, lookup, prev)
	if fmt.Sprint(got) != want {
		t.Fatalf("PeerAddrs with the resolver down = %v, want the last known %s", got, want)
	}
}
