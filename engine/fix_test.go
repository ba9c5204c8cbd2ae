package engine

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/mesh/meshtest"
	"github.com/lchat/lchat-caddy/space"
)

func newCountingEngine(t *testing.T, cfg Config) (*Engine, *meshtest.Counting) {
	t.Helper()
	fb, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := meshtest.NewCounting(fb)
	cfg.Bucket = c
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	cfg.Holder, cfg.Incarnation = "box", "1"
	if cfg.Kinds == nil {
		cfg.Kinds = map[string]Kind{"app": {Command: "/bin/true"}}
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e, c
}

// TestHeldSpaceStartsOneRecheck: requests to a space held after a heartbeat fence start
// one lease re-read between them, not a goroutine each, however slow the bucket is.
func TestHeldSpaceStartsOneRecheck(t *testing.T) {
	e, c := newCountingEngine(t, Config{})
	defer e.Close()
	const host = "held.example.com"
	unblock := make(chan struct{})
	c.SetFail(func(ctx context.Context, op meshtest.Op, key string) error {
		if key == space.LeaseKey(host) {
			select {
			case <-unblock:
			case <-ctx.Done():
			}
			return errors.New("bucket unavailable")
		}
		return nil
	})
	in := e.get(host)
	in.mu.Lock()
	in.held, in.leaseETag = true, "etag"
	in.setStateLocked(StateFenced)
	in.mu.Unlock()

	before := runtime.NumGoroutine()
	for range 500 {
		_, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"})
		var re *RetryError
		if !errors.As(err, &re) {
			t.Fatalf("Acquire of a held space: %v, want a RetryError", err)
		}
	}
	if grown := runtime.NumGoroutine() - before; grown > 5 {
		t.Fatalf("%d goroutines started by 500 requests to a held space, want at most one recheck", grown)
	}
	close(unblock)
	deadline := time.Now().Add(5 * time.Second)
	for in.rechecking.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if in.rechecking.Load() {
		t.Fatal("recheck still marked running after the bucket answered")
	}
}
