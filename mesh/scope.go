package mesh

import "strings"

// NormalizeHost lowercases host, drops a trailing dot and a :port suffix, so that a Host
// header and a registry key compare equal.
func NormalizeHost(host string) string {
	host = strings.ToLower(strings.TrimSpace(host))
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[:i], ":") {
		host = host[:i]
	} else if strings.HasPrefix(host, "[") {
		if j := strings.IndexByte(host, ']'); j > 0 {
			host = host[1:j]
		}
	}
	return strings.TrimSuffix(host, ".")
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
