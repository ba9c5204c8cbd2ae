package mesh

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/registry"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// Peer endpoint paths, mounted on each box's SELF URL.
const (
	PathRoute  = "/api/mesh/route/" // + host; PUT replicates, DELETE tombstones
	PathRoutes = "/api/mesh/routes"
	PathStatus = "/api/mesh/status"
)

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

// Authorize reports whether r carries "Authorization: Bearer <token>". The comparison is
// constant-time over SHA-256 digests, so neither the token nor its length leaks through
// timing. An empty token authorizes nothing.
func Authorize(r *http.Request, token Secret) bool {
	if token == "" {
		return false
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	a := sha256.Sum256([]byte(strings.TrimSpace(got)))
	b := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
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

// Client talks to peers' mesh endpoints.
type Client struct {
	// Token is the mesh token, sent as a bearer token.
	Token Secret
	// HTTPClient makes the requests. Default: a client with a 10s timeout.
	HTTPClient *http.Client
	// Logger receives fan-out logs. Default: a no-op logger.
	Logger *zap.Logger
	// Retries is how many times a fan-out retries a target after a network error or a 5xx.
	// Default: 2.
	Retries int
	// RetryDelay is the first retry's delay; it doubles each time. Default: 500ms.
	RetryDelay time.Duration
}

var defaultHTTPClient = &http.Client{Timeout: 10 * time.Second}

// StatusError is a peer's non-2xx answer.
type StatusError struct {
	Peer   string
	Op     string
	Status int
	Body   string
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("%s on %s: status %d", e.Op, e.Peer, e.Status)
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}

// Temporary reports whether retrying may help (5xx, 429).
func (e *StatusError) Temporary() bool {
	return e.Status >= 500 || e.Status == http.StatusTooManyRequests
}

func (c *Client) do(ctx context.Context, method, base, path, op string, body []byte, out any) error {
	return c.doHeader(ctx, method, base, path, op, body, out, nil)
}

// doHeader is do with extra request headers.
func (c *Client) doHeader(ctx context.Context, method, base, path, op string, body []byte, out any, hdr http.Header) error {
	base = strings.TrimSuffix(base, "/")
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return fmt.Errorf("%s on %s: %v", op, base, err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+string(c.Token))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTPClient
	if hc == nil {
		hc = defaultHTTPClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s on %s: %v", op, base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return &StatusError{Peer: base, Op: op, Status: resp.StatusCode, Body: strings.TrimSpace(string(snippet))}
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 256<<20)).Decode(out); err != nil {
		return fmt.Errorf("%s on %s: decoding answer: %v", op, base, err)
	}
	return nil
}

// PutRoute replicates one row to the peer at base (its SELF URL).
func (c *Client) PutRoute(ctx context.Context, base string, row RouteRow) error {
	if err := row.Validate(); err != nil {
		return err
	}
	body, err := json.Marshal(row)
	if err != nil {
		return fmt.Errorf("encoding route: %v", err)
	}
	return c.do(ctx, http.MethodPut, base, PathRoute+url.PathEscape(row.Host), "replicating route "+row.Host, body, nil)
}

// RevHeader carries a tombstone's revision on DELETE PathRoute.
const RevHeader = "X-Lchat-Rev"

// DeleteRoute tombstones host on the peer at base with the tombstone's revision rev (empty:
// an unconditional delete, as boxes without revisions send); deleting a host the peer
// lacks succeeds.
func (c *Client) DeleteRoute(ctx context.Context, base, host, rev string) error {
	host = NormalizeHost(host)
	var hdr http.Header
	if rev != "" {
		hdr = http.Header{RevHeader: {rev}}
	}
	return c.doHeader(ctx, http.MethodDelete, base, PathRoute+url.PathEscape(host), "tombstoning route "+host, nil, nil, hdr)
}

// ListRoutes returns the peer's in-scope routes.
func (c *Client) ListRoutes(ctx context.Context, base string) ([]RouteRow, error) {
	var out RoutesResponse
	if err := c.do(ctx, http.MethodGet, base, PathRoutes, "listing routes", nil, &out); err != nil {
		return nil, err
	}
	return out.Routes, nil
}

// Status returns the peer's status document, undecoded.
func (c *Client) Status(ctx context.Context, base string) (json.RawMessage, error) {
	var out json.RawMessage
	if err := c.do(ctx, http.MethodGet, base, PathStatus, "reading status", nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// FanoutResult is the outcome of one target of a fan-out.
type FanoutResult struct {
	Peer string
	Err  error
}

// Fanout replicates row to every target in the background and returns at once. Each
// target gets its own goroutine and retries network errors and 5xx answers; every
// outcome is logged. The returned channel yields one result per target and is closed when
// all are done; callers that do not care may ignore it. ctx should be the app's context,
// not a request's, so that a create returning does not cancel its fan-out.
func (c *Client) Fanout(ctx context.Context, row RouteRow, targets []Member) <-chan FanoutResult {
	return c.fanout(ctx, "replicate", row.Host, targets, func(ctx context.Context, peer string) error {
		return c.PutRoute(ctx, peer, row)
	})
}

// FanoutDelete tombstones host (revision rev) on every target, like Fanout.
func (c *Client) FanoutDelete(ctx context.Context, host, rev string, targets []Member) <-chan FanoutResult {
	return c.fanout(ctx, "tombstone", host, targets, func(ctx context.Context, peer string) error {
		return c.DeleteRoute(ctx, peer, host, rev)
	})
}

func (c *Client) fanout(ctx context.Context, what, host string, targets []Member, call func(context.Context, string) error) <-chan FanoutResult {
	logger := c.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	retries := c.Retries
	if retries <= 0 {
		retries = 2
	}
	delay := c.RetryDelay
	if delay <= 0 {
		delay = 500 * time.Millisecond
	}
	results := make(chan FanoutResult, len(targets))
	done := make(chan struct{}, len(targets))
	for _, t := range targets {
		go func(peer string) {
			var err error
			defer func() {
				results <- FanoutResult{Peer: peer, Err: err}
				done <- struct{}{}
			}()
			if safego.Run(logger, "mesh fan-out", func() { err = callRetrying(ctx, peer, call, retries, delay) }) != nil {
				err = fmt.Errorf("%s %s on %s: panic", what, host, peer)
			}
			if err != nil {
				logger.Warn("mesh fan-out failed; mesh-seed --prune or a later write reconciles it",
					zap.String("op", what), zap.String("host", host), zap.String("peer", peer), zap.Error(err))
			} else {
				logger.Debug("mesh fan-out done", zap.String("op", what), zap.String("host", host), zap.String("peer", peer))
			}
		}(t.Self)
	}
	go func() {
		for range targets {
			<-done
		}
		close(results)
	}()
	return results
}

// callRetrying calls call for peer, retrying a temporary failure up to retries times with
// a doubling delay. A refused row (RowError) and a permanent status are final.
func callRetrying(ctx context.Context, peer string, call func(ctx context.Context, peer string) error, retries int, delay time.Duration) error {
	for attempt := 0; ; attempt++ {
		err := call(ctx, peer)
		var se *StatusError
		var re *RowError
		retryable := err != nil && !errors.As(err, &re) && (!errors.As(err, &se) || se.Temporary())
		if !retryable || attempt >= retries || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay *= 2
	}
}

// Targets is the set of peers a row for host must reach: live members other than self
// that cover the host by their domains, plus those whose region is homeRegion, leaving
// out draining members (they are shutting down). Sorted by Self.
func Targets(host, homeRegion string, members []Member, self string) []Member {
	var out []Member
	for _, m := range members {
		if m.Self == self || m.Draining {
			continue
		}
		if RouteInScope(host, homeRegion, m.Domains, m.Region) {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Self < out[j].Self })
	return out
}

// Interface guards
var (
	_ fmt.Stringer   = RouteRow{}
	_ fmt.GoStringer = RouteRow{}
	_ error          = (*RowError)(nil)
	_ error          = (*StatusError)(nil)
)
