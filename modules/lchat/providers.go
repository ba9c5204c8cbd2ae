package lchat

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/provider"
)

// ProviderConfig is a provider this fleet may delegate spaces to (package provider):
// the lchat app's `providers`, or a `provider <name>` block of its Caddyfile option.
type ProviderConfig struct {
	// Name is how routes name it (`provider`): 1 to 32 of a-z, 0-9 and '-'. Required.
	Name string `json:"name,omitempty"`
	// URL is its base URL, https://host[:port]: its provider API and where the requests
	// of its spaces are forwarded, its certificate verified against this host. Required.
	URL string `json:"url,omitempty"`
	// Token is sent to it (bearer token and marker key); placeholders expanded, e.g.
	// {env.LCHAT_PROVIDER_PARTNER_TOKEN}. At least 32 characters. Required.
	Token string `json:"token,omitempty"`
	// AcceptToken is what it signs the exports it hands back with; placeholders
	// expanded. At least 32 characters, not Token. Required.
	AcceptToken string `json:"accept_token,omitempty"`
	// Domains are the domains whose hosts may be delegated to it. Required.
	Domains []string `json:"domains,omitempty"`
	// MaxSpaces caps the spaces delegated to it. Default 0: no cap.
	MaxSpaces int `json:"max_spaces,omitempty"`
	// TrustedCAFiles are PEM files of the only roots its certificate may chain to.
	// Default: the system's roots.
	TrustedCAFiles []string `json:"trusted_ca_files,omitempty"`
	// DialTimeout bounds the dial and TLS handshake. Default 5s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`
	// ResponseHeaderTimeout bounds the wait for an answer's headers. Default 2m.
	ResponseHeaderTimeout caddy.Duration `json:"response_header_timeout,omitempty"`
	// MaxResponseBytes bounds an answer's body (event streams and WebSockets aside).
	// Default 256 MiB.
	MaxResponseBytes int64 `json:"max_response_bytes,omitempty"`
	// MaxExportBytes bounds the state it hands back on a reclaim. Default 8 GiB.
	MaxExportBytes int64 `json:"max_export_bytes,omitempty"`
}

// ProviderClientConfig is a fleet this fleet hosts spaces for, as its provider: the lchat
// app's `provider_clients`, or a `provider_client <name>` block of its Caddyfile option.
type ProviderClientConfig struct {
	// Name is how its hosted routes name it (`hosted_for`). Required.
	Name string `json:"name,omitempty"`
	// Token is what it sends (its provider's `token`); placeholders expanded. Required.
	Token string `json:"token,omitempty"`
	// SignToken signs the exports handed to it (its provider's `accept_token`);
	// placeholders expanded. Required.
	SignToken string `json:"sign_token,omitempty"`
	// Domains are the domains whose hosts it may have hosted here. Required.
	Domains []string `json:"domains,omitempty"`
	// MaxSpaces caps the spaces hosted for it. Default 0: no cap.
	MaxSpaces int `json:"max_spaces,omitempty"`
	// MaxExportBytes bounds the state it sends for one space. Default 8 GiB.
	MaxExportBytes int64 `json:"max_export_bytes,omitempty"`
}

// providerSet is what a config gives the seam: its providers' connections and its
// clients.
type providerSet struct {
	conns   map[string]*provider.Conn
	limits  map[string]provider.Limits // per provider, of what it hands back
	clients provider.Clients
	// clientLimits bound what each client sends.
	clientLimits map[string]provider.Limits

	// toldMu guards told: when each delegated host was last announced awake at its
	// provider to this box's peers (awakeAtProvider).
	toldMu sync.Mutex
	told   map[string]time.Time
}

// tellPeersEvery is how often a delegated host found awake at its provider is announced
// to this box's peers, at most: each forwarded request finds it so, and one announcement
// reopens every stream waiting for it.
const tellPeersEvery = 5 * time.Second

// awakeAtProvider is a provider.Conn's Answered: the event streams held for a delegated
// space whose provider answered one of its requests reopen at once (held.Conns.AwakeAtProvider),
// rather than at their next probe.
func (ps *providerSet) awakeAtProvider(a *App) func(host string) {
	return func(host string) {
		cs := a.conns
		if cs == nil {
			return
		}
		now := time.Now()
		ps.toldMu.Lock()
		tell := now.Sub(ps.told[host]) >= tellPeersEvery
		if tell {
			if len(ps.told) >= 4096 {
				for h, at := range ps.told {
					if now.Sub(at) >= tellPeersEvery {
						delete(ps.told, h)
					}
				}
			}
			ps.told[host] = now
		}
		ps.toldMu.Unlock()
		cs.AwakeAtProvider(host, tell)
	}
}

// provisionProviders reads `providers` and `provider_clients`. Errors name the field,
// never a token.
func (a *App) provisionProviders() error {
	repl := caddy.NewReplacer()
	expand := func(s string) string { return repl.ReplaceKnown(s, "") }
	ps := &providerSet{conns: map[string]*provider.Conn{}, limits: map[string]provider.Limits{}, clientLimits: map[string]provider.Limits{},
		told: map[string]time.Time{}}
	for i, pc := range a.Providers {
		if pc == nil {
			return fmt.Errorf("providers[%d]: empty", i)
		}
		p := &provider.Provider{Name: pc.Name, URL: expand(pc.URL), Token: mesh.Secret(expand(pc.Token)),
			AcceptToken: mesh.Secret(expand(pc.AcceptToken)), Domains: expandList(pc.Domains, expand), MaxSpaces: pc.MaxSpaces}
		if err := p.Validate(); err != nil {
			return fmt.Errorf("providers[%d]: %v", i, err)
		}
		if ps.conns[p.Name] != nil {
			return fmt.Errorf("providers[%d]: %s is named twice", i, p.Name)
		}
		roots, err := loadRoots(pc.TrustedCAFiles, expand)
		if err != nil {
			return fmt.Errorf("providers[%d]: trusted_ca_files: %v", i, err)
		}
		c, err := provider.NewConn(p, provider.ConnOptions{Roots: roots, DialTimeout: time.Duration(pc.DialTimeout),
			ResponseHeaderTimeout: time.Duration(pc.ResponseHeaderTimeout), MaxResponseBytes: pc.MaxResponseBytes},
			func(err error) error { return reverseproxy.NewDialError(err) })
		if err != nil {
			return fmt.Errorf("providers[%d]: %v", i, err)
		}
		c.Observe = observeProvider
		c.Answered = ps.awakeAtProvider(a)
		ps.conns[p.Name] = c
		ps.limits[p.Name] = provider.Limits{MaxBytes: pc.MaxExportBytes}
	}
	for i, cc := range a.ProviderClients {
		if cc == nil {
			return fmt.Errorf("provider_clients[%d]: empty", i)
		}
		c := &provider.Client{Name: cc.Name, Token: mesh.Secret(expand(cc.Token)), SignToken: mesh.Secret(expand(cc.SignToken)),
			Domains: expandList(cc.Domains, expand), MaxSpaces: cc.MaxSpaces}
		if err := c.Validate(); err != nil {
			return fmt.Errorf("provider_clients[%d]: %v", i, err)
		}
		for _, o := range ps.clients {
			if o.Name == c.Name {
				return fmt.Errorf("provider_clients[%d]: %s is named twice", i, c.Name)
			}
			if o.Token == c.Token {
				return fmt.Errorf("provider_clients[%d]: %s has the token of %s; each client needs its own", i, c.Name, o.Name)
			}
		}
		ps.clients = append(ps.clients, c)
		ps.clientLimits[c.Name] = provider.Limits{MaxBytes: cc.MaxExportBytes}
	}
	a.prov = ps
	return nil
}

// expandList expands each value and splits it on commas and spaces.
func expandList(in []string, expand func(string) string) []string {
	var out []string
	for _, v := range in {
		out = append(out, strings.FieldsFunc(expand(v), func(r rune) bool { return r == ',' || r == ' ' })...)
	}
	return out
}

// loadRoots is a pool of the PEM files' certificates; none: nil (the system's roots).
func loadRoots(files []string, expand func(string) string) (*x509.CertPool, error) {
	if len(files) == 0 {
		return nil, nil
	}
	pool := x509.NewCertPool()
	for _, f := range files {
		raw, err := os.ReadFile(expand(f))
		if err != nil {
			return nil, err
		}
		if !pool.AppendCertsFromPEM(raw) {
			return nil, errors.New(f + " holds no PEM certificate")
		}
	}
	return pool, nil
}

// closeProviders drops the idle connections of a config going away.
func (ps *providerSet) close() {
	if ps == nil {
		return
	}
	for _, c := range ps.conns {
		c.Close()
	}
}

// conn is the connection to the provider named name, or nil.
func (ps *providerSet) conn(name string) *provider.Conn {
	if ps == nil {
		return nil
	}
	return ps.conns[name]
}
