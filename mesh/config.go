// Package mesh holds the plain-Go building blocks of the lchat mesh: configuration from the
// environment, host scope, rendezvous (HRW) placement, heartbeat membership over the shared
// bucket with self-fencing, the forwarded-request marker, the peer replication client and
// server helpers, and the mesh-seed planner. It has no Caddy glue; the lchat app wires it in.
package mesh

import (
	"bufio"
	"encoding"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/lchat/lchat-caddy/registry"
)

// Environment variable names (the contract in DESIGN.md).
const (
	EnvSelf    = "LCHAT_MESH_SELF"
	EnvDomains = "LCHAT_MESH_DOMAINS"
	EnvToken   = "LCHAT_MESH_TOKEN"
	EnvRegion  = "LCHAT_MESH_REGION"
	// EnvTokenAccept lists tokens a box accepts besides its own and never sends: the
	// middle steps of a rolling token rotation.
	EnvTokenAccept = "LCHAT_MESH_TOKEN_ACCEPT"
)

// Secret is a string that never prints: fmt verbs, %#v and JSON all show "[redacted]".
// Convert with string(s) only where the value is actually used (an HMAC key, a header).
type Secret string

const redacted = "[redacted]"

// String redacts the secret.
func (s Secret) String() string { return redacted }

// GoString redacts the secret for %#v.
func (s Secret) GoString() string { return redacted }

// MarshalText redacts the secret in JSON, YAML and the like.
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Config is this box's mesh identity, read from the environment.
// The zero Config (Self empty) means the mesh is off.
type Config struct {
	// Self is this box's base URL as its peers reach it: scheme (http or https) and host
	// with an optional port, nothing else. It is also this box's member identity.
	Self string
	// Domains are the mesh domains, lowercased; only hosts equal to or directly under
	// one of them take part in placement.
	Domains []string
	// Token is the shared bearer secret of the mesh: the one this box sends.
	Token Secret
	// Accept are tokens this box accepts from peers besides Token (LCHAT_MESH_TOKEN_ACCEPT).
	Accept []Secret
	// Region is this box's region label; empty means region-agnostic.
	Region string
}

// Enabled reports whether the mesh is on (LCHAT_MESH_SELF was set).
func (c Config) Enabled() bool { return c.Self != "" }

// String describes the config for logs, with the token redacted.
func (c Config) String() string {
	if !c.Enabled() {
		return "mesh off"
	}
	tok := "unset"
	if c.Token != "" {
		tok = redacted
	}
	return fmt.Sprintf("mesh self=%s region=%q domains=%s token=%s accepted_tokens=%d",
		c.Self, c.Region, strings.Join(c.Domains, ","), tok, len(c.Accept))
}

// GoString is String, so %#v cannot leak the token either.
func (c Config) GoString() string { return c.String() }

// ParseEnv reads the mesh configuration through getenv (os.Getenv, or a lookup into an
// env file). LCHAT_MESH_SELF absent or blank means the mesh is off and the zero Config is
// returned. With SELF set, LCHAT_MESH_DOMAINS and LCHAT_MESH_TOKEN (at least MinTokenLen
// characters) are required. Errors
// name the variable at fault and never contain the token.
func ParseEnv(getenv func(string) string) (Config, error) {
	self := strings.TrimSpace(getenv(EnvSelf))
	if self == "" {
		return Config{}, nil
	}
	var cfg Config
	var err error
	if cfg.Self, err = ParseSelf(self); err != nil {
		return Config{}, fmt.Errorf("%s: %v", EnvSelf, err)
	}
	rawDomains := getenv(EnvDomains)
	if strings.TrimSpace(rawDomains) == "" {
		return Config{}, fmt.Errorf("%s is set but %s is missing: the mesh needs its domains (comma-separated)", EnvSelf, EnvDomains)
	}
	if cfg.Domains, err = ParseDomains(rawDomains); err != nil {
		return Config{}, fmt.Errorf("%s: %v", EnvDomains, err)
	}
	tok := strings.TrimSpace(getenv(EnvToken))
	if tok == "" {
		return Config{}, fmt.Errorf("%s is set but %s is missing: every box of the mesh needs the same shared token", EnvSelf, EnvToken)
	}
	if err := CheckToken(tok); err != nil {
		return Config{}, err
	}
	cfg.Token = Secret(tok)
	if cfg.Accept, err = parseAccept(getenv(EnvTokenAccept), cfg.Token); err != nil {
		return Config{}, err
	}
	cfg.Region = strings.TrimSpace(getenv(EnvRegion))
	if cfg.Region != "" {
		// The same rule as a route's home_region, or no region-pinned space could
		// ever be placed on this box.
		if err := registry.ValidateRegion(cfg.Region); err != nil {
			return Config{}, fmt.Errorf("%s: %v", EnvRegion, err)
		}
	}
	return cfg, nil
}

// ParseSelf checks and normalizes a SELF URL: scheme http or https, a host, an optional
// port, and nothing else (no userinfo, path, query or fragment). The result is lowercased
// with no trailing slash, so every box derives the same member identity from it.
func ParseSelf(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("%q is not a URL: want scheme://host[:port]", raw)
	}
	scheme := strings.ToLower(u.Scheme)
	switch {
	case scheme != "http" && scheme != "https":
		return "", fmt.Errorf("%q: scheme must be http or https", raw)
	case u.Opaque != "" || u.Host == "":
		return "", fmt.Errorf("%q: want scheme://host[:port]", raw)
	case u.User != nil:
		return "", fmt.Errorf("%q: must not carry userinfo", redactUser(u))
	case u.Path != "" && u.Path != "/":
		return "", fmt.Errorf("%q: must not have a path", raw)
	case u.RawQuery != "" || u.ForceQuery:
		return "", fmt.Errorf("%q: must not have a query", raw)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return "", fmt.Errorf("%q: must not have a fragment", raw)
	}
	host := strings.ToLower(u.Hostname())
	if host == "" {
		return "", fmt.Errorf("%q: missing host", raw)
	}
	hostport := u.Host
	if p := u.Port(); p != "" {
		if n, err := parsePort(p); err != nil || n == 0 {
			return "", fmt.Errorf("%q: bad port", raw)
		}
		hostport = net.JoinHostPort(host, p)
	} else if strings.HasSuffix(u.Host, ":") {
		return "", fmt.Errorf("%q: empty port", raw)
	} else if strings.Contains(host, ":") {
		hostport = "[" + host + "]"
	} else {
		hostport = host
	}
	return scheme + "://" + hostport, nil
}

func redactUser(u *url.URL) string {
	c := *u
	c.User = url.User("xxx")
	return c.Redacted()
}

func parsePort(p string) (int, error) {
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' {
			return 0, errors.New("not a number")
		}
		n = n*10 + int(c-'0')
		if n > 65535 {
			return 0, errors.New("out of range")
		}
	}
	return n, nil
}

// ParseDomains splits a comma-separated domain list, lowercases it, drops empty entries
// and a trailing dot, and rejects entries that are not plain DNS names (wildcards, ports,
// paths). It fails when nothing is left.
func ParseDomains(raw string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, d := range strings.Split(raw, ",") {
		d = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(d)), ".")
		if d == "" {
			continue
		}
		if !validHostname(d) {
			return nil, fmt.Errorf("%q is not a domain name (write example.com, not *.example.com or a URL)", d)
		}
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no domains listed")
	}
	return out, nil
}

// validHostname reports whether s is a lowercase DNS name of letters, digits and hyphens.
func validHostname(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// ReadEnvFile reads a systemd-style environment file such as /data/router.env: KEY=VALUE
// lines, blank lines and lines starting with # or ; ignored, an optional leading "export ",
// values optionally in double quotes (with \" \\ \n \t escapes) or single quotes (literal).
// Errors give the line number only, never the line, since values may be secrets.
func ReadEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading env file: %v", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		key, val, ok := strings.Cut(line, "=")
		key = strings.TrimSpace(key)
		if !ok || registry.ValidateEnvName(key) != nil {
			return nil, fmt.Errorf("reading env file %s: line %d is not KEY=VALUE", path, n)
		}
		val, err = unquoteEnv(strings.TrimSpace(val))
		if err != nil {
			return nil, fmt.Errorf("reading env file %s: line %d: %v", path, n, err)
		}
		env[key] = val
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading env file %s: %v", path, err)
	}
	return env, nil
}

func unquoteEnv(v string) (string, error) {
	if len(v) == 0 {
		return v, nil
	}
	switch v[0] {
	case '\'':
		if len(v) < 2 || v[len(v)-1] != '\'' {
			return "", errors.New("unterminated single quote")
		}
		return v[1 : len(v)-1], nil
	case '"':
		if len(v) < 2 || v[len(v)-1] != '"' {
			return "", errors.New("unterminated double quote")
		}
		var b strings.Builder
		in := v[1 : len(v)-1]
		for i := 0; i < len(in); i++ {
			c := in[i]
			if c == '"' {
				return "", errors.New("unescaped double quote inside value")
			}
			if c != '\\' || i == len(in)-1 {
				b.WriteByte(c)
				continue
			}
			i++
			switch in[i] {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			default:
				b.WriteByte(in[i])
			}
		}
		return b.String(), nil
	}
	return v, nil
}

// ParseEnvFile reads the mesh configuration from an environment file (mesh-seed
// --env-file /data/router.env). Variables missing from the file are looked up with
// fallback when it is non-nil (os.Getenv, say), so a file may hold only some of them.
func ParseEnvFile(path string, fallback func(string) string) (Config, error) {
	env, err := ReadEnvFile(path)
	if err != nil {
		return Config{}, err
	}
	return ParseEnv(func(k string) string {
		if v, ok := env[k]; ok {
			return v
		}
		if fallback != nil {
			return fallback(k)
		}
		return ""
	})
}

// Interface guards
var (
	_ fmt.Stringer           = Secret("")
	_ fmt.GoStringer         = Secret("")
	_ encoding.TextMarshaler = Secret("")
	_ fmt.Stringer           = Config{}
	_ fmt.GoStringer         = Config{}
)
