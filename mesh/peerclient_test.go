package mesh

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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
