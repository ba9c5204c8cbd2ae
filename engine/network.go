package engine

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/sandbox"
)

// Network is what a kind's instances reach over the network (Kind.Network).
type Network string

// Network modes of a kind.
const (
	// NetworkAuto (the default, "") is NetworkEgress for a kind isolated on this box
	// when the box can install the egress filter, else NetworkHost (logged at start).
	NetworkAuto Network = ""
	// NetworkNone runs each instance in an empty network namespace: its own loopback
	// only. The box still reaches it over its Unix socket, a filesystem path.
	NetworkNone Network = "none"
	// NetworkEgress lets an instance reach the internet and the box's resolver, and
	// refuses at once its connections to the box (its loopback and its own addresses),
	// link-local and metadata addresses, private ranges and the mesh peers, except the
	// kind's NetworkAllow prefixes (sandbox.Firewall).
	NetworkEgress Network = "egress"
	// NetworkHost leaves the instance's network as the box's own: the explicit opt-out.
	NetworkHost Network = "host"
)

// ParseAllow reads one entry of a kind's allow list: a prefix (10.1.0.0/16, fd12::/16)
// or a single address (a /32 or /128). A prefix with host bits set is refused, so that
// 10.1.2.3/16 is not silently read as 10.1.0.0/16.
func ParseAllow(s string) (netip.Prefix, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("network_allow: %q: an address with a zone is not a range", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("network_allow: %q is neither an address nor a CIDR range", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("network_allow: %s has host bits set: did you mean %s?", s, p.Masked())
	}
	return p, nil
}

// checkNetwork refuses a network setting that cannot work on this host whatever the
// engine: an unknown mode, an allow list outside egress, a confined network on a kind
// that is not isolated, a capability the mode needs.
func checkNetwork(k Kind) error {
	switch k.Network {
	case NetworkAuto, NetworkHost:
	case NetworkEgress, NetworkNone:
		if k.Isolation == IsolationNone {
			return fmt.Errorf("network %s needs the space's own uid and cgroup: set isolation on, or network host", k.Network)
		}
	default:
		return fmt.Errorf("unknown network %q: none, egress or host", k.Network)
	}
	if len(k.NetworkAllow) > 0 && k.Network != NetworkEgress {
		return errors.New("network_allow: only network egress takes an allow list")
	}
	for _, p := range k.NetworkAllow {
		if !p.IsValid() {
			return errors.New("network_allow: an invalid range")
		}
	}
	switch k.Network {
	case NetworkEgress:
		return sandbox.CheckFirewallCaps()
	case NetworkNone:
		return sandbox.CheckEmptyNetwork()
	}
	return nil
}

// firewall returns this engine's egress filter, installing it on first use. A failure
// is remembered until the next kind set, so a wake does not retry it.
func (e *Engine) firewall() (*sandbox.Firewall, error) {
	e.netMu.Lock()
	defer e.netMu.Unlock()
	if e.fw != nil || e.fwErr != nil {
		return e.fw, e.fwErr
	}
	first, count := e.uidRange()
	fw, err := sandbox.OpenFirewall(sandbox.FirewallConfig{UIDFirst: first, UIDCount: count})
	if err != nil {
		e.fwErr = err
		return nil, err
	}
	if len(e.peers) > 0 {
		if err := fw.SetPeers(e.peers); err != nil {
			e.log.Error("setting the mesh peers in the egress filter", zap.Error(err))
		}
	}
	e.fw = fw
	e.log.Info("egress filter installed", zap.String("filter", fw.Describe()))
	return fw, nil
}

// openFirewall returns the egress filter if it is installed, nil otherwise.
func (e *Engine) openFirewall() *sandbox.Firewall {
	e.netMu.Lock()
	defer e.netMu.Unlock()
	return e.fw
}

// retryFirewall forgets a failure to install the egress filter: a new kind set tries
// again.
func (e *Engine) retryFirewall() {
	e.netMu.Lock()
	e.fwErr = nil
	e.netMu.Unlock()
}

// closeFirewall removes the egress filter, unless an instance still runs (a drain that
// ran out of time): its traffic stays filtered until the process exits and the next
// box's start removes the table.
func (e *Engine) closeFirewall() {
	for _, in := range e.all() {
		in.mu.Lock()
		p := in.proc
		in.mu.Unlock()
		if p != nil && !p.done() {
			if fw := e.openFirewall(); fw != nil {
				e.log.Warn("keeping the egress filter: an instance still runs", zap.String("host", in.host), zap.String("table", fw.Name()))
			}
			return
		}
	}
	e.netMu.Lock()
	fw := e.fw
	e.fw = nil
	e.netMu.Unlock()
	if fw != nil {
		if err := fw.Close(); err != nil {
			e.log.Error("removing the egress filter", zap.Error(err))
		}
	}
}

// network is how instances of k run on this box, given whether k is isolated here. An
// error means a kind that asks for none or egress cannot have it; whyNot says why an
// unset network is host.
func (e *Engine) network(k Kind, iso bool) (mode Network, whyNot, err error) {
	switch k.Network {
	case NetworkHost:
		return NetworkHost, nil, nil
	case NetworkNone, NetworkEgress:
		if !iso {
			return "", nil, fmt.Errorf("network %s needs the space's own uid and cgroup, and this box cannot isolate the kind: %v", k.Network, e.whyNotIsolated(k))
		}
		if k.Network == NetworkEgress {
			if _, err := e.firewall(); err != nil {
				return "", nil, err
			}
		}
		return k.Network, nil, nil
	}
	if !iso {
		return NetworkHost, fmt.Errorf("the kind is not isolated: %v", e.whyNotIsolated(k)), nil
	}
	if _, err := e.firewall(); err != nil {
		return NetworkHost, err, nil
	}
	return NetworkEgress, nil, nil
}

// admitNetwork readies the network of one start of an isolated instance under uid and
// returns its release, to call once the instance has ended (nil: nothing to release).
func (e *Engine) admitNetwork(k Kind, mode Network, uid uint32) (func(), error) {
	fw := e.openFirewall()
	switch {
	case fw == nil || mode == NetworkNone:
		// No filter on this box, or the instance has no network of the box's at all.
		return nil, nil
	case mode == NetworkHost:
		return fw.Admit(uid, sandbox.Egress{Host: true})
	}
	return fw.Admit(uid, sandbox.Egress{Allow: k.NetworkAllow})
}

// SetNetworkPeers sets the mesh peers' addresses, which instances under network egress
// may not reach. The mesh calls it whenever its members' addresses change.
func (e *Engine) SetNetworkPeers(addrs []netip.Addr) {
	e.netMu.Lock()
	defer e.netMu.Unlock()
	if slices.Equal(addrs, e.peers) {
		return
	}
	e.peers = slices.Clone(addrs)
	if e.fw == nil {
		return
	}
	if err := e.fw.SetPeers(addrs); err != nil {
		e.log.Error("setting the mesh peers in the egress filter", zap.Error(err))
		return
	}
	e.log.Info("mesh peers refused to egress instances", zap.Int("addresses", len(addrs)))
}
