package mesh

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/backoff"
	"github.com/lchat/lchat-caddy/internal/safego"
)

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
	// RetryDelay is the first retry's delay; it doubles each time, up to
	// fanoutBackoff.Max. Default: fanoutBackoff.First (500ms).
	RetryDelay time.Duration
}

var defaultHTTPClient = &http.Client{Timeout: 10 * time.Second}

// fanoutBackoff spaces the tries of one target of a fan-out (a route row replicated or
// tombstoned on a peer) after a network error or a temporary status: 500ms, then 1s with
// the default two retries, doubling to 8s with more. Client.RetryDelay replaces First.
var fanoutBackoff = backoff.Curve{First: 500 * time.Millisecond, Max: 8 * time.Second}

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

// Call sends one request to the peer at base (its SELF URL) with the mesh token and
// returns its answer, whatever the status: the caller reads and closes the body.
func (c *Client) Call(ctx context.Context, method, base, path string, hdr http.Header, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+string(c.Token))
	hc := c.HTTPClient
	if hc == nil {
		hc = defaultHTTPClient
	}
	return hc.Do(req)
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
	curve := fanoutBackoff
	if c.RetryDelay > 0 {
		curve.First = c.RetryDelay
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
			if safego.Run(logger, "mesh fan-out", func() { err = callRetrying(ctx, peer, call, retries, curve) }) != nil {
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

// Notify POSTs body (JSON) to path on the peer at base, retrying a temporary failure
// (a transport error, a 5xx, a 429) up to retries times, waiting by the caller's curve
// (callRetrying). A 4xx answer is final. Ending ctx stops the retries.
func (c *Client) Notify(ctx context.Context, base, path, op string, body []byte, retries int, curve backoff.Curve) error {
	return callRetrying(ctx, base, func(ctx context.Context, peer string) error {
		return c.do(ctx, http.MethodPost, peer, path, op, body, nil)
	}, retries, curve)
}

// callRetrying calls call for peer, retrying a temporary failure up to retries times,
// waiting curve.After(n) after the nth failure. A refused row (RowError) and a permanent
// status are final.
func callRetrying(ctx context.Context, peer string, call func(ctx context.Context, peer string) error, retries int, curve backoff.Curve) error {
	for attempt := 1; ; attempt++ {
		err := call(ctx, peer)
		var se *StatusError
		var re *RowError
		retryable := err != nil && !errors.As(err, &re) && (!errors.As(err, &se) || se.Temporary())
		if !retryable || attempt > retries || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(curve.After(attempt)):
		}
	}
}

// Interface guards
var _ error = (*StatusError)(nil)
