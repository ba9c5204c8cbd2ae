package engine_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/spacestore"
)

// flaky fails writes of manifests while failing is set: a bucket outage at checkpoint time.
type flaky struct {
	bucket.Bucket
	failing atomic.Bool
}

func (f *flaky) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	if f.failing.Load() && strings.HasSuffix(key, "/manifest") {
		return bucket.Info{}, errors.New("injected outage")
	}
	return f.Bucket.Put(ctx, key, body, size, cond)
}

func TestFailedCheckpointKeepsLocalStateUntilFlushed(t *testing.T) {
	f := newFixture(t)
	fb := &flaky{Bucket: f.bucket}
	e := f.engine("1", func(c *engine.Config) { c.Bucket = fb })
	sp := engine.Space{Host: "flaky.test", Kind: "app"}
	ctx := context.Background()

	u := acquire(t, e, sp)
	call(t, u, "POST", "/msg?body=one")
	u.Release()
	if err := e.Sleep(ctx, sp.Host); err != nil {
		t.Fatal(err)
	}
	u = acquire(t, e, sp)
	call(t, u, "POST", "/msg?body=two")
	u.Release()
	fb.failing.Store(true)
	if err := e.Sleep(ctx, sp.Host); err == nil {
		t.Fatal("sleep reported success with the manifest write failing")
	}
	if l := readLease(t, f.bucket, sp.Host); l.Released {
		t.Fatal("lease released although the bucket lacks the latest state")
	}
	fb.failing.Store(false)
	// The next wake keeps the newer local state instead of restoring "one" over it.
	u = acquire(t, e, sp)
	if _, got := call(t, u, "GET", "/msgs"); got != "one\ntwo" {
		t.Fatalf("after a failed checkpoint the wake served %q, want one and two", got)
	}
	call(t, u, "POST", "/msg?body=three")
	u.Release()
	fb.failing.Store(true)
	e.Sleep(ctx, sp.Host)
	fb.failing.Store(false)
	if err := e.Drain(ctx); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if l := readLease(t, f.bucket, sp.Host); !l.Released {
		t.Fatal("lease not released after the drain flushed the state")
	}
	e2 := f.engine("2", nil)
	u = acquire(t, e2, sp)
	defer u.Release()
	if _, got := call(t, u, "GET", "/msgs"); got != "one\ntwo\nthree" {
		t.Fatalf("state in the bucket after drain = %q", got)
	}
}

func TestRemoveDropsLocalStateOnly(t *testing.T) {
	f := newFixture(t)
	e := f.engine("1", func(c *engine.Config) {})
	sp := engine.Space{Host: "gone.test", Kind: "app"}
	ctx := context.Background()
	u := acquire(t, e, sp)
	call(t, u, "POST", "/msg?body=keep")
	u.Release()
	e.Sleep(ctx, sp.Host)
	u = acquire(t, e, sp)
	pid := status(e, sp.Host).PID
	u.Release()
	_, etag, _ := spacestore.ReadManifest(ctx, f.bucket, sp.Host)
	if err := e.Remove(ctx, sp.Host); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Fatal("instance running after Forget")
	}
	if status(e, sp.Host).Host != "" {
		t.Fatal("forgotten space still in Status")
	}
	if l := readLease(t, f.bucket, sp.Host); !l.Released {
		t.Fatalf("lease after Forget = %+v", l)
	}
	if _, cur, _ := spacestore.ReadManifest(ctx, f.bucket, sp.Host); cur != etag {
		t.Fatal("Forget changed bucket data")
	}
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), "eng*", "spaces", sp.Host))
	for _, m := range matches {
		t.Fatalf("local state left at %s", m)
	}
}
