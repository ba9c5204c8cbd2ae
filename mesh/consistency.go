package mesh

import (
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
)

// ConfigFacts are the parts of a box's config that must agree with each other.
type ConfigFacts struct {
	// Self is LCHAT_MESH_SELF.
	Self string
	// Domains are the mesh domains (LCHAT_MESH_DOMAINS).
	Domains []string
	// Wildcards are the domains whose wildcard certificate the box manages
	// (wildcard_domains, LCHAT_WILDCARD_DOMAINS); empty when it manages none.
	Wildcards []string
	// RelocateZone is relocate_dns's zone; empty without relocate_dns.
	RelocateZone string
}

// ConfigProblems are what CheckConfig finds: Refuse stops the start-up, Warn is logged.
type ConfigProblems struct {
	Refuse []string
	Warn   []string
}

// CheckConfig finds the contradictions in a mesh box's config:
//
//   - a mesh domain no managed wildcard covers: a peer forwarding to an https SELF
//     verifies the owner's certificate against the space's hostname, so every mesh
//     domain D needs *.D. Refused with an https SELF; a warning with a plain-http SELF,
//     where forwards carry no TLS;
//   - a plain-http SELF on an address that is neither private nor loopback: the mesh
//     token and replicated env values would cross the network in clear (warning);
//   - a relocate_dns zone that contains none of the mesh domains (refused) or not all of
//     them (warning): relocate --move-dns could not set those hosts' records.
func CheckConfig(f ConfigFacts) ConfigProblems {
	var p ConfigProblems
	plain := strings.HasPrefix(f.Self, "http://")
	if len(f.Wildcards) > 0 {
		var uncovered []string
		for _, d := range f.Domains {
			if !slices.Contains(f.Wildcards, d) {
				uncovered = append(uncovered, d)
			}
		}
		if len(uncovered) > 0 {
			msg := fmt.Sprintf("mesh domains %s are not among the wildcard domains %s: peers could not verify a forwarded request's TLS against *.<domain>; add them to LCHAT_WILDCARD_DOMAINS",
				strings.Join(uncovered, ", "), strings.Join(f.Wildcards, ", "))
			if plain {
				p.Warn = append(p.Warn, msg+" (harmless while SELF is plain http)")
			} else {
				p.Refuse = append(p.Refuse, msg)
			}
		}
	}
	if InsecureSelf(f.Self) {
		p.Warn = append(p.Warn, "LCHAT_MESH_SELF is plain http on an address that is not private: the mesh token and replicated env values cross the network unencrypted; use https")
	}
	if zone := f.RelocateZone; zone != "" {
		var outside []string
		for _, d := range f.Domains {
			if !InZone(d, zone) {
				outside = append(outside, d)
			}
		}
		switch {
		case len(outside) == len(f.Domains) && len(outside) > 0:
			p.Refuse = append(p.Refuse, fmt.Sprintf("relocate_dns zone %s contains none of the mesh domains (%s): relocate --move-dns could set no record",
				zone, strings.Join(f.Domains, ", ")))
		case len(outside) > 0:
			p.Warn = append(p.Warn, fmt.Sprintf("relocate_dns zone %s does not contain the mesh domains %s: relocate --move-dns will refuse their hosts",
				zone, strings.Join(outside, ", ")))
		}
	}
	return p
}

// InZone reports whether name is zone or under it.
func InZone(name, zone string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	zone = strings.TrimSuffix(strings.ToLower(zone), ".")
	return name == zone || strings.HasSuffix(name, "."+zone)
}

// InsecureSelf reports a SELF URL that sends peer traffic in the clear beyond a private
// network: plain http to a name, or to an IP that is neither private (10/8, 172.16/12,
// 192.168/16, fc00::/7), loopback nor link-local. localhost is loopback.
func InsecureSelf(self string) bool {
	u, err := url.Parse(self)
	if err != nil || u.Scheme != "http" {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return false
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return true
	}
	return !(ip.IsPrivate() || ip.IsLoopback() || ip.IsLinkLocalUnicast())
}
