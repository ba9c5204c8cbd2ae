package mesh

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lchat/lchat-caddy/internal/backoff"
)

func TestClientAgainstPeer(t *testing.T) {
	p, url := startPeer(t)
	ctx := context.Background()
	c := &Client{Token: testToken}
	row := RouteRow{Host: "A.example.com", Kind: "chat", Version: "1.2", Hibernate: true, Env: map[string]string{"ADMIN_TOKEN": "inst-secret"}}
	if err := c.PutRoute(ctx, url, row); err != nil {
		t.Fatal(err)
	}
	if err := c.PutRoute(ctx, url, RouteRow{Host: "x.other.net", Kind: "chat", Hibernate: true, HomeRegion: "fi"}); err != nil {
		t.Fatalf("a row pinned to the peer's region is in its scope: %v", err)
	}
	err := c.PutRoute(ctx, url, RouteRow{Host: "y.other.net", Kind: "chat", Hibernate: true})
	var se *StatusError
	if !errors.As(err, &se) || se.Status != http.StatusBadRequest {
		t.Fatalf("out-of-scope row: %v, want 400", err)
	}
	rows, err := c.ListRoutes(ctx, url)
	if err != nil || len(rows) != 2 {
		t.Fatalf("ListRoutes = %v, %v", rows, err)
	}
	p.mu.Lock()
	got := p.rows["a.example.com"]
	p.mu.Unlock()
	if got.Env["ADMIN_TOKEN"] != "inst-secret" || got.Version != "1.2" {
		t.Fatalf("stored row %s lost fields", got)
	}
	for i := 0; i < 2; i++ { // a tombstone is idempotent
		if err := c.DeleteRoute(ctx, url, "a.example.com", ""); err != nil {
			t.Fatal(err)
		}
	}
	st, err := c.Status(ctx, url)
	if err != nil || string(st) != `{"routes":1}` {
		t.Fatalf("Status = %s, %v", st, err)
	}
	bad := &Client{Token: "wrong"}
	if err := bad.PutRoute(ctx, url, row); !errors.As(err, &se) || se.Status != http.StatusUnauthorized {
		t.Fatalf("wrong token: %v, want 401", err)
	}
	if err != nil && strings.Contains(err.Error(), "wrong") {
		t.Fatalf("error echoes the token: %v", err)
	}
}

func TestFanout(t *testing.T) {
	p1, u1 := startPeer(t)
	p2, u2 := startPeer(t)
	p2.fail.Store(1) // the first attempt on p2 gets a 503 and is retried
	_, u3 := startPeer(t)
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()

	c := &Client{Token: testToken, RetryDelay: time.Millisecond}
	row := RouteRow{Host: "a.example.com", Kind: "chat", Hibernate: true}
	targets := []Member{{Self: u1}, {Self: u2}, {Self: deadURL}}
	start := time.Now()
	res := c.Fanout(context.Background(), row, targets)
	if time.Since(start) > 50*time.Millisecond {
		t.Fatal("Fanout blocked its caller")
	}
	errs := map[string]error{}
	for r := range res {
		errs[r.Peer] = r.Err
	}
	if len(errs) != 3 || errs[u1] != nil || errs[u2] != nil || errs[deadURL] == nil {
		t.Fatalf("results %v", errs)
	}
	for _, p := range []*peerServer{p1, p2} {
		p.mu.Lock()
		_, ok := p.rows["a.example.com"]
		p.mu.Unlock()
		if !ok {
			t.Fatal("row missing on a reachable peer")
		}
	}
	for r := range c.FanoutDelete(context.Background(), "a.example.com", "", []Member{{Self: u1}, {Self: u3}}) {
		if r.Err != nil {
			t.Fatalf("tombstone on %s: %v", r.Peer, r.Err)
		}
	}
	p1.mu.Lock()
	n := len(p1.rows)
	p1.mu.Unlock()
	if n != 0 {
		t.Fatal("tombstone did not remove the row")
	}
	// No targets: the channel closes at once.
	if _, ok := <-c.Fanout(context.Background(), row, nil); ok {
		t.Fatal("result with no targets")
	}
}

// TestCallRetryingWaits: a peer call that keeps failing on a temporary error is tried again
// after each wait of its curve, capped at the curve's Max (a fan-out with more retries than
// the default two no longer doubles without end), retries times; a refused row and a
// permanent status are not retried.
func TestCallRetryingWaits(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name    string
		err     error
		retries int
		curve   backoff.Curve
		calls   []time.Duration // when each call was made, from the first
	}{
		{"fan-out, default retries", &StatusError{Status: http.StatusServiceUnavailable}, 2, fanoutBackoff,
			[]time.Duration{0, 500 * ms, 1500 * ms}},
		{"fan-out, capped", errors.New("connection refused"), 6, fanoutBackoff,
			[]time.Duration{0, 500 * ms, 1500 * ms, 3500 * ms, 7500 * ms, 15500 * ms, 23500 * ms}},
		{"notice", &StatusError{Status: http.StatusTooManyRequests}, 3, backoff.Curve{First: 200 * ms, Max: fanoutBackoff.Max},
			[]time.Duration{0, 200 * ms, 600 * ms, 1400 * ms}},
		{"refused row", &RowError{Field: "host", Reason: "bad"}, 3, fanoutBackoff, []time.Duration{0}},
		{"permanent status", &StatusError{Status: http.StatusBadRequest}, 3, fanoutBackoff, []time.Duration{0}},
	} {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			var calls []time.Duration
			err := callRetrying(t.Context(), "peer", func(ctx context.Context, peer string) error {
				calls = append(calls, time.Since(start))
				return tc.err
			}, tc.retries, tc.curve)
			if err != tc.err {
				t.Errorf("%s: error %v, want %v", tc.name, err, tc.err)
			}
			if !slices.Equal(calls, tc.calls) {
				t.Errorf("%s: calls at %v, want %v", tc.name, calls, tc.calls)
			}
		})
	}
}
