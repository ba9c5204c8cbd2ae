// Package registry holds the routes of one box: which hosts exist, what kind of space
// serves each one, and how. Routes live in an embedded bbolt file on disk and in memory
// for the request path, where a lookup is a read-locked map access.
package registry

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Route is one host's routing row.
type Route struct {
	// Host is the lowercase DNS name the route answers for.
	Host string `json:"host"`
	// Kind names the configured kind that runs a hibernating space.
	Kind string `json:"kind,omitempty"`
	// Version is the instance's version, passed to the kind as it likes.
	Version string `json:"version,omitempty"`
	// Hibernate makes the route a hibernating space; false is a live route,
	// proxied to Upstream on this box or forwarded to the box at LivesAt.
	Hibernate bool `json:"hibernate"`
	// HomeRegion pins the space to a region's boxes (the mesh).
	HomeRegion string `json:"home_region,omitempty"`
	// Env holds the instance's own values (admin token, entitlement, seeded name).
	// Values are secrets: they go to disk and to the instance, never into a listing.
	Env map[string]string `json:"env,omitempty"`
	// Upstream is a live route's dial address on this box: host:port, or a Unix
	// socket path.
	Upstream string `json:"upstream,omitempty"`
	// LivesAt is, for a live route that runs on another box of the mesh, that box's
	// SELF URL (scheme://host[:port]). Such a row has no Upstream: requests are
	// forwarded to LivesAt and never dialed from here.
	LivesAt string `json:"lives_at,omitempty"`
	// Provider names the provider this fleet has delegated the space to (provider.go):
	// every box forwards its requests there. Empty: the fleet runs it (the default).
	Provider string `json:"provider,omitempty"`
	// ProviderState is where a delegation stands while Provider is set: empty once the
	// provider serves the space, ProviderDelegating or ProviderReclaiming while it moves
	// (no side serves it then: every request is a 503 with Retry-After).
	ProviderState string `json:"provider_state,omitempty"`
	// HostedFor names, on a provider's fleet, the fleet that delegated the space here:
	// only requests and calls signed by that fleet reach it. Empty: the fleet's own.
	HostedFor string `json:"hosted_for,omitempty"`
	// Created and Updated are set by the registry.
	Created time.Time `json:"created"`
	Updated time.Time `json:"updated"`
	// Rev is the revision of the route's last change (version.go): set by the box that
	// made the change, carried by replication, compared to resolve any delivery order.
	Rev string `json:"rev,omitempty"`
}

// Summary is a Route as listings and status output show it: env names only.
type Summary struct {
	Host       string   `json:"host"`
	Kind       string   `json:"kind,omitempty"`
	Version    string   `json:"version,omitempty"`
	Hibernate  bool     `json:"hibernate"`
	HomeRegion string   `json:"home_region,omitempty"`
	EnvNames   []string `json:"env_names,omitempty"`
	Upstream   string   `json:"upstream,omitempty"`
	LivesAt    string   `json:"lives_at,omitempty"`
	Provider   string   `json:"provider,omitempty"`
	// ProviderState: ProviderDelegating, ProviderReclaiming or empty.
	ProviderState string    `json:"provider_state,omitempty"`
	HostedFor     string    `json:"hosted_for,omitempty"`
	Created       time.Time `json:"created"`
	Updated       time.Time `json:"updated"`
	Rev           string    `json:"rev,omitempty"`
}

// Summary returns rt without env values.
func (rt *Route) Summary() Summary {
	s := Summary{
		Host:          rt.Host,
		Kind:          rt.Kind,
		Version:       rt.Version,
		Hibernate:     rt.Hibernate,
		HomeRegion:    rt.HomeRegion,
		Upstream:      rt.Upstream,
		LivesAt:       rt.LivesAt,
		Provider:      rt.Provider,
		ProviderState: rt.ProviderState,
		HostedFor:     rt.HostedFor,
		Created:       rt.Created,
		Updated:       rt.Updated,
		Rev:           rt.Rev,
	}
	for k := range rt.Env {
		s.EnvNames = append(s.EnvNames, k)
	}
	slices.Sort(s.EnvNames)
	return s
}

// clone returns a deep copy, so a stored route never shares its env map with a caller.
func (rt *Route) clone() *Route {
	c := *rt
	c.Env = maps.Clone(rt.Env)
	return &c
}

// Validate checks a route's fields on their own. Whether its kind is configured is
// the app's business.
func (rt *Route) Validate() error {
	if err := ValidateHost(rt.Host); err != nil {
		return err
	}
	if rt.Hibernate {
		if rt.Kind == "" {
			return fmt.Errorf("route %s: hibernating route needs a kind", rt.Host)
		}
		if rt.Upstream != "" {
			return fmt.Errorf("route %s: hibernating route cannot have an upstream (its socket is derived locally)", rt.Host)
		}
		if rt.LivesAt != "" {
			return fmt.Errorf("route %s: hibernating route cannot have lives_at (placement decides where it runs)", rt.Host)
		}
	} else {
		switch {
		case rt.Upstream == "" && rt.LivesAt == "":
			return fmt.Errorf("route %s: live route (hibernate false) needs an upstream, or lives_at when it runs on another box", rt.Host)
		case rt.Upstream != "" && rt.LivesAt != "":
			return fmt.Errorf("route %s: live route has both an upstream and lives_at; it runs either here or on another box", rt.Host)
		case rt.LivesAt != "":
			if err := validSelfURL(rt.LivesAt); err != nil {
				return fmt.Errorf("route %s: lives_at: %v", rt.Host, err)
			}
		}
	}
	if err := rt.ValidateProvider(); err != nil {
		return err
	}
	if rt.Kind != "" && !ValidKind(rt.Kind) {
		return fmt.Errorf("route %s: invalid kind name %q", rt.Host, rt.Kind)
	}
	for k := range rt.Env {
		if err := ValidateEnvName(k); err != nil {
			return fmt.Errorf("route %s: %v", rt.Host, err)
		}
	}
	return nil
}

// validSelfURL accepts a box's SELF URL: http or https, a host, an optional port, and
// nothing else.
func validSelfURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("%q is not a URL", s)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q: scheme must be http or https", s)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("%q has no host", s)
	case u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
		return fmt.Errorf("%q must be scheme://host[:port] with no path, query or user", s)
	}
	return nil
}

// ValidKind is the one kind-name rule, for a kind in a box's config and a kind named by a
// route, local or replicated: 1 to 64 of a-z, 0-9, '-' and '_', starting with a letter
// or a digit. A route's kind must name a configured kind, so both follow this rule.
func ValidKind(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '-' || c == '_')) {
			return false
		}
	}
	return true
}

// ValidateEnvName accepts POSIX-style variable names.
func ValidateEnvName(k string) error {
	if k == "" {
		return errors.New("empty env name")
	}
	for i, c := range k {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return fmt.Errorf("invalid env name %q", k)
		}
	}
	return nil
}

// ValidateRegion accepts a region label, as home_region carries: 1 to 32 lowercase
// letters, digits and '-'.
func ValidateRegion(r string) error {
	if r == "" || len(r) > 32 {
		return fmt.Errorf("region %q must be 1 to 32 characters", r)
	}
	for i := 0; i < len(r); i++ {
		if c := r[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("region %q contains %q; only a-z, 0-9 and '-' are allowed", r, c)
		}
	}
	return nil
}

// ValidateHost accepts lowercase DNS names (punycode labels included) and rejects
// ports, paths, wildcards, uppercase, IP addresses and trailing dots, saying which.
func ValidateHost(h string) error {
	switch {
	case h == "":
		return errors.New("host is empty")
	case len(h) > 253:
		return fmt.Errorf("host %q is longer than 253 characters", h)
	case strings.ContainsAny(h, "/?#"):
		return fmt.Errorf("host %q must not contain a path", h)
	case strings.Contains(h, ":"):
		return fmt.Errorf("host %q must not contain a port", h)
	case strings.Contains(h, "*"):
		return fmt.Errorf("host %q: wildcards are not routes", h)
	case strings.HasSuffix(h, "."):
		return fmt.Errorf("host %q must not end with a dot", h)
	case strings.ToLower(h) != h:
		return fmt.Errorf("host %q must be lowercase", h)
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return fmt.Errorf("host %q is an IP address, not a DNS name", h)
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" {
			return fmt.Errorf("host %q has an empty label", h)
		}
		if len(label) > 63 {
			return fmt.Errorf("host %q has a label longer than 63 characters", h)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("host %q: a label must not start or end with a hyphen", h)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("host %q contains %q; only a-z, 0-9, '-' and '.' are allowed (use punycode for IDNs)", h, c)
			}
		}
	}
	return nil
}
