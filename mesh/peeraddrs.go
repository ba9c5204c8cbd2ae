package mesh

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"time"
)

// LookupFunc resolves a host name to its addresses (net.Resolver.LookupNetIP for "ip").
type LookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

// PeerAddrs are the addresses of the members: each one's advertised address and the
// host of its SELF URL (an address, or a name resolved through lookup). A name that does
// not resolve keeps the addresses it had in prev (by name), so a failing resolver does
// not open a peer to the spaces; next is the map to pass as prev the next time. The
// result is sorted and without duplicates.
func PeerAddrs(ctx context.Context, members []Member, lookup LookupFunc, prev map[string][]netip.Addr) (addrs []netip.Addr, next map[string][]netip.Addr) {
	next = map[string][]netip.Addr{}
	for _, m := range members {
		if a, err := netip.ParseAddr(m.Address); err == nil {
			addrs = append(addrs, a.Unmap())
		}
		u, err := url.Parse(m.Self)
		if err != nil || u.Hostname() == "" {
			continue
		}
		host := u.Hostname()
		if a, err := netip.ParseAddr(host); err == nil {
			addrs = append(addrs, a.Unmap().WithZone(""))
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := lookup(lctx, host)
		cancel()
		if err != nil || len(got) == 0 {
			got = prev[host]
		}
		for i := range got {
			got[i] = got[i].Unmap().WithZone("")
		}
		next[host] = got
		addrs = append(addrs, got...)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs), next
}

// WatchPeerAddrs hands the live members' addresses (PeerAddrs) to apply at once and
// then every interval, until ctx ends; apply sees every change, and only changes.
func WatchPeerAddrs(ctx context.Context, m *Membership, every time.Duration, lookup LookupFunc, apply func([]netip.Addr)) {
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var last []netip.Addr
	var names map[string][]netip.Addr
	first := true
	for {
		var addrs []netip.Addr
		addrs, names = PeerAddrs(ctx, m.Live(), lookup, names)
		if first || !slices.Equal(addrs, last) {
			apply(addrs)
			last, first = addrs, false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
