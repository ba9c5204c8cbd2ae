package mesh

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/lchat/lchat-caddy/registry"
)

// The peer API's wire: the endpoints every box serves on its SELF URL, the row they carry
// and how it is checked, and the bearer token that guards them. The client (peerclient.go)
// and the lchat_mesh_api handler both speak it from here, so the two ends cannot drift.

// Peer endpoint paths, mounted on each box's SELF URL.
const (
	PathRoute  = "/api/mesh/route/" // + host; PUT replicates, DELETE tombstones
	PathRoutes = "/api/mesh/routes"
	PathStatus = "/api/mesh/status"
	// PathConns is held connections between boxes (docs/connections.md, "Across boxes"):
	// POST PathConns+"notice" tells a holding box what became of its messages; PathConns
	// + host + a control path (/ws/send, /ws/close, /ws/set, /ws/conns) acts on the
	// connections of host this box holds.
	PathConns = "/api/mesh/conns/"
	// PathWatch is held open by a box that stands by for spaces of this one (GET): it
	// answers at once with this box's incarnation (IncarnationHeader) and ends when the
	// box exits (the body says "exiting") or reloads its config; a watch that breaks and
	// cannot be opened again because the address refuses connections means this process
	// is gone (box/standbywatch.go).
	PathWatch = "/api/mesh/watch"
)

// IncarnationHeader carries a box's incarnation on PathWatch's answer.
const IncarnationHeader = "X-Lchat-Incarnation"

// RevHeader carries a tombstone's revision on DELETE PathRoute.
const RevHeader = "X-Lchat-Rev"

// DefaultMaxRowBytes bounds a replicated row's request body.
const DefaultMaxRowBytes = 256 << 10

// RouteRow is the replicated form of a registry row: only what a peer needs to route and
// wake the space. Socket and data paths are never part of it; each box derives them.
type RouteRow struct {
	// Host is the instance hostname, the registry key.
	Host string `json:"host"`
	// Kind names the kind config (command, env allowlist) that runs the space.
	Kind string `json:"kind"`
	// Version is the kind's version the space runs.
	Version string `json:"version,omitempty"`
	// Hibernate is true for a space whose state lives in the bucket (any box may wake it).
	Hibernate bool `json:"hibernate"`
	// HomeRegion scopes placement to that region's boxes; empty means the whole fleet.
	HomeRegion string `json:"home_region,omitempty"`
	// Env is the instance's own values (admin token, entitlement, seeded name). They are
	// secrets: never log them.
	Env map[string]string `json:"env,omitempty"`
	// Rev is the revision of the change this row carries (registry/version.go): a peer
	// stores the row only if it is newer than what it holds. Empty from a box that
	// predates revisions.
	Rev string `json:"rev,omitempty"`
	// LivesAt is the SELF of the box a live (non-hibernating) space is pinned to: peers
	// store it and forward there instead of looking for a local socket. Required when
	// Hibernate is false, empty otherwise.
	LivesAt string `json:"lives_at,omitempty"`
	// Provider, ProviderState and HostedFor are the delegation fields
	// (registry.Route): a space delegated to a provider, or hosted for another fleet.
	Provider      string `json:"provider,omitempty"`
	ProviderState string `json:"provider_state,omitempty"`
	HostedFor     string `json:"hosted_for,omitempty"`
}

// String describes the row for logs; env values are never shown, only their names.
func (r RouteRow) String() string {
	names := make([]string, 0, len(r.Env))
	for k := range r.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	return fmt.Sprintf("route %s kind=%s version=%s hibernate=%t home_region=%q lives_at=%q env=[%s]",
		r.Host, r.Kind, r.Version, r.Hibernate, r.HomeRegion, r.LivesAt, strings.Join(names, ","))
}

// GoString is String, so %#v cannot leak env values either.
func (r RouteRow) GoString() string { return r.String() }

// RowError is a replicated row that fails validation: the peer endpoint answers 400 with
// its message. It names the field and the rule, never a value that may be secret.
type RowError struct {
	Field  string
	Reason string
}

func (e *RowError) Error() string { return fmt.Sprintf("invalid route row: %s: %s", e.Field, e.Reason) }

// Limits on a row's fields.
const (
	maxEnvVars    = 64
	maxEnvValue   = 8 << 10
	maxShortField = 128
)

// EnvNameAllowed reports whether a replicated row may carry the env variable name at all.
// The kind's own allowlist narrows this further on the receiving box.
func EnvNameAllowed(name string) bool {
	return !registry.ForbiddenEnv(name)
}

// Validate normalizes the host and checks every field. It returns a *RowError.
func (r *RouteRow) Validate() error {
	r.Host = NormalizeHost(r.Host)
	if registry.ValidateHost(r.Host) != nil || !strings.Contains(r.Host, ".") {
		return &RowError{"host", "must be a DNS name"}
	}
	if !registry.ValidKind(r.Kind) {
		return &RowError{"kind", "must be 1-64 letters, digits, '.', '_' or '-'"}
	}
	if r.Version != "" && !validToken(r.Version) {
		return &RowError{"version", "must be 1-128 letters, digits, '.', '_' or '-'"}
	}
	if r.Rev != "" && !registry.ValidRev(r.Rev) {
		return &RowError{"rev", "must be <16 hex digits>-<origin>"}
	}
	if r.HomeRegion != "" {
		if err := registry.ValidateRegion(r.HomeRegion); err != nil {
			return &RowError{"home_region", err.Error()}
		}
	}
	if len(r.Env) > maxEnvVars {
		return &RowError{"env", fmt.Sprintf("more than %d variables", maxEnvVars)}
	}
	for k, v := range r.Env {
		if !EnvNameAllowed(k) {
			if registry.ValidateEnvName(k) == nil {
				return &RowError{"env", fmt.Sprintf("variable %s may not be replicated", k)}
			}
			return &RowError{"env", "a variable name is not a portable name"}
		}
		if len(v) > maxEnvValue || strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v) {
			return &RowError{"env." + k, "value too long, not UTF-8, or holds a NUL byte"}
		}
	}
	if err := r.validateProvider(); err != nil {
		return err
	}
	if r.Hibernate {
		if r.LivesAt != "" {
			return &RowError{"lives_at", "must be empty for a hibernating space"}
		}
		return nil
	}
	if r.LivesAt == "" {
		return &RowError{"lives_at", "required for a live (non-hibernating) space: the box it runs on"}
	}
	self, err := ParseSelf(r.LivesAt)
	if err != nil {
		return &RowError{"lives_at", "must be a box's SELF URL (scheme://host[:port])"}
	}
	r.LivesAt = self
	return nil
}

// validateProvider checks the delegation fields by the registry's one rule.
func (r *RouteRow) validateProvider() error {
	if r.Provider == "" && r.ProviderState == "" && r.HostedFor == "" {
		return nil
	}
	rt := registry.Route{Host: r.Host, Hibernate: r.Hibernate, Provider: r.Provider, ProviderState: r.ProviderState, HostedFor: r.HostedFor}
	if err := rt.ValidateProvider(); err != nil {
		return &RowError{"provider", err.Error()}
	}
	return nil
}

// validToken reports whether s is a short field (a version, an incarnation) of letters,
// digits, '.', '_' or '-': nothing a peer sends this way can break a log line or a header.
func validToken(s string) bool {
	if len(s) == 0 || len(s) > maxShortField {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// InScopeFor reports whether a box with these domains and region should hold the row: the
// host is under its domains, or the row's home_region is the box's region.
func (r RouteRow) InScopeFor(domains []string, region string) bool {
	return RouteInScope(r.Host, r.HomeRegion, domains, region)
}

// Authorize reports whether r carries "Authorization: Bearer <t>" for token or one of
// accept (the tokens of a rotation in progress). Each comparison is constant-time over
// SHA-256 digests, and every candidate is compared, so neither a token, its length nor
// which one matched leaks through timing. An empty token authorizes nothing.
func Authorize(r *http.Request, token Secret, accept ...Secret) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	a := sha256.Sum256([]byte(strings.TrimSpace(got)))
	match := 0
	for _, t := range append([]Secret{token}, accept...) {
		if t == "" {
			continue
		}
		b := sha256.Sum256([]byte(t))
		match |= subtle.ConstantTimeCompare(a[:], b[:])
	}
	return match == 1
}

// HostFromPath extracts the host of a PathRoute request path.
func HostFromPath(p string) (string, bool) {
	rest, ok := strings.CutPrefix(p, PathRoute)
	if !ok || rest == "" || strings.Contains(rest, "/") {
		return "", false
	}
	if h, err := url.PathUnescape(rest); err == nil {
		rest = h
	}
	h := NormalizeHost(rest)
	return h, registry.ValidateHost(h) == nil // the registry's rule: a row for it can be stored
}

// DecodeRow reads and validates a replicated row from a PUT request body of at most
// maxBytes (DefaultMaxRowBytes when <= 0). When the request path is under PathRoute, it
// must name a valid host and the body's host must match it. Every error is a *RowError,
// meant for a 400 response.
func DecodeRow(r *http.Request, maxBytes int64) (RouteRow, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxRowBytes
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxBytes+1))
	if err != nil {
		return RouteRow{}, &RowError{"body", "reading failed"}
	}
	if int64(len(raw)) > maxBytes {
		return RouteRow{}, &RowError{"body", fmt.Sprintf("larger than %d bytes", maxBytes)}
	}
	var row RouteRow
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&row); err != nil {
		return RouteRow{}, &RowError{"body", "not a JSON route row"}
	}
	if dec.More() {
		return RouteRow{}, &RowError{"body", "trailing data after the JSON row"}
	}
	if err := row.Validate(); err != nil {
		return RouteRow{}, err
	}
	if strings.HasPrefix(r.URL.Path, PathRoute) {
		// The path names the row; a path without a valid host (empty, "..", a slash)
		// must not let the body pick one.
		pathHost, ok := HostFromPath(r.URL.Path)
		if !ok {
			return RouteRow{}, &RowError{"host", "the path names no valid host"}
		}
		if pathHost != row.Host {
			return RouteRow{}, &RowError{"host", "does not match the host in the path"}
		}
	}
	return row, nil
}

// RoutesResponse is the body of GET PathRoutes.
type RoutesResponse struct {
	Routes []RouteRow `json:"routes"`
}

// WriteRoutes answers GET PathRoutes with rows.
func WriteRoutes(w http.ResponseWriter, rows []RouteRow) error {
	if rows == nil {
		rows = []RouteRow{}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(RoutesResponse{Routes: rows})
}

// Interface guards
var (
	_ fmt.Stringer   = RouteRow{}
	_ fmt.GoStringer = RouteRow{}
	_ error          = (*RowError)(nil)
)
