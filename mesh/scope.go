package mesh

import (
	"net/netip"
	"strings"
)

// NormalizeHost is the host that a Host header, a registry key or a peer's path names, in
// the one form every comparison of hosts uses (registry lookups, placement, markers, the
// console):
//
//	"Example.COM."    -> "example.com"  lowercased, without the root's trailing dot
//	"example.com:443" -> "example.com"  without the port
//	"[::1]:8080"      -> "::1"          an IPv6 literal without brackets or port,
//	"[::1]"           -> "::1"          whether or not a port follows it;
//	"::1", "0::1"     -> "::1"          a bare IPv6 address too (with its colons unbracketed
//	                                    there is no port to split off), in canonical text
//	""                -> ""
//	"[::1", "[::1]x", "[a.b]:80", "a:b:c", "a.b:http", "[fe80::1%eth0]" -> ""
//
// Input that is not host[:port] (RFC 3986: a bracketed IPv6 address or a colon-free name
// or IPv4 address, then optionally ":" and digits) has no host to take out and yields "",
// which names no route. It only takes the host out: whether the host may name a route is
// registry.ValidateHost's call (an IP address never may), so a malformed name such as
// "a.." passes through lowercased, as "a.", for ValidateHost to refuse.
func NormalizeHost(host string) string {
	host = strings.ToLower(strings.TrimSpace(host))
	if rest, ok := strings.CutPrefix(host, "["); ok {
		addr, after, ok := strings.Cut(rest, "]")
		if !ok || after != "" && !isPortSuffix(after) {
			return ""
		}
		return canonicalIPv6(addr)
	}
	if i := strings.IndexByte(host, ':'); i >= 0 {
		if strings.IndexByte(host[i+1:], ':') >= 0 {
			return canonicalIPv6(host)
		}
		if !isPortSuffix(host[i:]) {
			return ""
		}
		host = host[:i]
	}
	return strings.TrimSuffix(host, ".")
}

// isPortSuffix reports whether s is ":" and a port's digits (RFC 3986 allows none).
func isPortSuffix(s string) bool {
	if s == "" || s[0] != ':' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// canonicalIPv6 is s as an IPv6 address in canonical text, or "" when s is not one. A
// zone names an interface of one box, never a host the fleet shares.
func canonicalIPv6(s string) string {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() || a.Zone() != "" {
		return ""
	}
	return a.String()
}

// InScope reports whether host takes part in mesh placement: it is equal to one of the
// domains or directly under one (exactly one more label: a.example.com is under
// example.com, a.b.example.com is not). Hosts outside the mesh domains are always served
// by the box that receives them.
func InScope(host string, domains []string) bool {
	host = NormalizeHost(host)
	if host == "" {
		return false
	}
	for _, d := range domains {
		if host == d {
			return true
		}
		if len(host) > len(d)+1 && strings.HasSuffix(host, d) && host[len(host)-len(d)-1] == '.' {
			if !strings.Contains(host[:len(host)-len(d)-1], ".") {
				return true
			}
		}
	}
	return false
}

// RouteInScope reports whether a box with domains and region holds, and takes part in
// placing, the route of host homed in homeRegion: the host is in scope of the domains
// (InScope), or homeRegion is set and is the box's region.
func RouteInScope(host, homeRegion string, domains []string, region string) bool {
	return InScope(host, domains) || homeRegion != "" && homeRegion == region
}
