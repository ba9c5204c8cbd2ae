// Package provider is the provider seam: a fleet delegates some of its spaces to a
// partner (a provider: its own servers, its own bucket) while the spaces' addresses,
// certificates and members stay with the fleet. It holds the plain rules of both sides
// (which provider may host which space, which fleet a provider hosts a space for), the
// forwarded marker of the extra hop, the provider API's wire and client, the signed
// export a space's state travels in, and the moves out and back (Delegate, Reclaim). No
// Caddy glue: modules/lchat carries these out, box.Box serves and settles the routes.
//
// docs/providers.md is the contract for another implementation of a provider.
package provider

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

// MinTokenLen is the shortest token either direction accepts: a token is a bearer token
// and a MAC key (the forwarded marker, the export's signature), as the mesh token is.
const MinTokenLen = mesh.MinTokenLen

// Provider is a partner this fleet may delegate spaces to (the fleet's side).
type Provider struct {
	// Name is how routes name it (registry.Route.Provider).
	Name string
	// URL is its base URL, https://host[:port]: the provider API is under it and every
	// request of a delegated space is forwarded to it, its certificate verified against
	// this host.
	URL string
	// Token is what this fleet sends it: the bearer token of its API calls and the key
	// of the forwarded marker. Never logged.
	Token mesh.Secret
	// AcceptToken is what it signs the exports it hands back with. Never logged.
	AcceptToken mesh.Secret
	// Domains are the domains whose hosts it may host (a host under one of them).
	Domains []string
	// MaxSpaces caps the spaces delegated to it; 0: no cap.
	MaxSpaces int
}

// Client is a fleet this fleet hosts spaces for, as a provider (the provider's side).
type Client struct {
	// Name is how the hosted routes name it (registry.Route.HostedFor).
	Name string
	// Token is what the client sends (its Provider.Token): its bearer token and the key
	// of its forwarded marker. Never logged.
	Token mesh.Secret
	// SignToken signs the exports handed to it (its Provider.AcceptToken). Never logged.
	SignToken mesh.Secret
	// Domains are the domains whose hosts it may have hosted here.
	Domains []string
	// MaxSpaces caps the spaces hosted for it; 0: no cap.
	MaxSpaces int
}

// Errors of the rules. Each says what the caller does: ErrNotCovered and ErrCap are a
// refusal of the request (403 and 409), ErrNotYours a space of someone else (404 on the
// provider API: a client learns nothing of other fleets' spaces).
var (
	ErrNotCovered = errors.New("host is outside the domains this provider may host")
	ErrCap        = errors.New("cap on spaces reached")
	ErrNotYours   = errors.New("no such space hosted for this fleet")
)

// Validate checks a provider's config. Its errors name the field, never a token.
func (p *Provider) Validate() error {
	if err := registry.ValidateProviderName(p.Name); err != nil {
		return err
	}
	if err := ValidBaseURL(p.URL); err != nil {
		return fmt.Errorf("provider %s: url: %v", p.Name, err)
	}
	if len(p.Token) < MinTokenLen || len(p.AcceptToken) < MinTokenLen {
		return fmt.Errorf("provider %s: token and accept_token must each be at least %d characters (generate them with `lchat-caddy mesh-token`)", p.Name, MinTokenLen)
	}
	if p.Token == p.AcceptToken {
		return fmt.Errorf("provider %s: token and accept_token must differ (one per direction)", p.Name)
	}
	return validDomains(p.Name, p.Domains, p.MaxSpaces)
}

// Validate checks a client's config. Its errors name the field, never a token.
func (c *Client) Validate() error {
	if err := registry.ValidateProviderName(c.Name); err != nil {
		return err
	}
	if len(c.Token) < MinTokenLen || len(c.SignToken) < MinTokenLen {
		return fmt.Errorf("client %s: token and sign_token must each be at least %d characters", c.Name, MinTokenLen)
	}
	if c.Token == c.SignToken {
		return fmt.Errorf("client %s: token and sign_token must differ (one per direction)", c.Name)
	}
	return validDomains(c.Name, c.Domains, c.MaxSpaces)
}

func validDomains(name string, domains []string, maxSpaces int) error {
	if len(domains) == 0 {
		return fmt.Errorf("%s: domains: at least one domain is required", name)
	}
	for _, d := range domains {
		if err := registry.ValidateHost(d); err != nil {
			return fmt.Errorf("%s: domains: %v", name, err)
		}
	}
	if maxSpaces < 0 {
		return fmt.Errorf("%s: max_spaces must not be negative", name)
	}
	return nil
}

// ValidBaseURL accepts https://host[:port] and nothing else: no plain HTTP (the hop
// carries the space's requests and its env), no path, query or user.
func ValidBaseURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("%q is not a URL", s)
	case u.Scheme != "https":
		return fmt.Errorf("%q: the scheme must be https", s)
	case u.Hostname() == "":
		return fmt.Errorf("%q has no host", s)
	case u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("%q must be https://host[:port] with no path, query or user", s)
	}
	return nil
}

// covers reports whether host is under one of domains.
func covers(domains []string, host string) bool {
	for _, d := range domains {
		if strings.HasSuffix(host, "."+d) {
			return true
		}
	}
	return false
}

// MayDelegate is the rule of a delegation on the fleet's side: host must be under one of
// p's domains, and p below its cap counting the delegated spaces already (delegated,
// which does not include host).
func (p *Provider) MayDelegate(host string, delegated int) error {
	if !covers(p.Domains, host) {
		return fmt.Errorf("%s to %s: %w", host, p.Name, ErrNotCovered)
	}
	if p.MaxSpaces > 0 && delegated >= p.MaxSpaces {
		return fmt.Errorf("%s has %d spaces (max_spaces %d): %w", p.Name, delegated, p.MaxSpaces, ErrCap)
	}
	return nil
}

// MayHost is the rule on the provider's side: a space may be hosted for c when host is
// under c's domains, c is below its cap (hosted: its spaces here besides host) and the
// route held here for host, if any, is c's. A route of this fleet or of another client
// is ErrNotYours, whatever c asks.
func (c *Client) MayHost(host string, cur *registry.Route, hosted int) error {
	if cur != nil {
		return c.Owns(cur)
	}
	if !covers(c.Domains, host) {
		return fmt.Errorf("%s for %s: %w", host, c.Name, ErrNotCovered)
	}
	if c.MaxSpaces > 0 && hosted >= c.MaxSpaces {
		return fmt.Errorf("%s has %d spaces hosted here (max_spaces %d): %w", c.Name, hosted, c.MaxSpaces, ErrCap)
	}
	return nil
}

// Owns is the one scope rule of the provider API and of forwarded requests: a client
// acts on a route only when the route is hosted for it.
func (c *Client) Owns(rt *registry.Route) error {
	if rt == nil || rt.HostedFor != c.Name {
		return ErrNotYours
	}
	return nil
}

// Clients are the fleets this fleet hosts for.
type Clients []*Client

// Authenticate is the client whose token r carries as its bearer token (constant-time
// against every client's), or nil.
func (cs Clients) Authenticate(r *http.Request) *Client {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return nil
	}
	a := sha256.Sum256([]byte(strings.TrimSpace(got)))
	var found *Client
	for _, c := range cs {
		b := sha256.Sum256([]byte(c.Token))
		if subtle.ConstantTimeCompare(a[:], b[:]) == 1 {
			found = c
		}
	}
	return found
}

// Named is the client of that name, or nil.
func (cs Clients) Named(name string) *Client {
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	return nil
}
