package membucket

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/buckettest"
)

func TestConformance(t *testing.T) {
	buckettest.Run(t, func(t *testing.T) bucket.Bucket { return New() }, buckettest.HoldsObjects())
}

// The store's clock is the test's: LastModified and ListPage.Now follow it, not the
// box's, so liveness judged on them can be driven.
func TestStoreClock(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 600e6, time.UTC)
	b := New()
	b.Clock = func() time.Time { return now }
	b.Granularity = time.Second
	ctx := context.Background()
	info, err := b.Put(ctx, "k", strings.NewReader("x"), 1, bucket.Cond{})
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Truncate(time.Second); !info.LastModified.Equal(want) {
		t.Fatalf("LastModified %v, want %v", info.LastModified, want)
	}
	now = now.Add(90 * time.Second)
	b.Offset = -time.Minute
	page, err := b.List(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := page.Now.Sub(page.Objects[0].LastModified); got != 30*time.Second {
		t.Fatalf("store-clock age %v, want 30s", got)
	}
}

func TestCounting(t *testing.T) {
	ctx := context.Background()
	mem := New()
	c := NewCounting(mem)
	if _, err := c.Put(ctx, "a", strings.NewReader("1"), 1, bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	cut := errors.New("connection refused")
	c.SetFail(func(ctx context.Context, op Op, key string) error { return cut })
	if _, err := c.Put(ctx, "b", strings.NewReader("2"), 1, bucket.Cond{}); !errors.Is(err, cut) {
		t.Fatalf("Put while cut = %v", err)
	}
	if _, err := mem.Head(ctx, "b"); !errors.Is(err, bucket.ErrNotFound) {
		t.Fatalf("a put failed unsent was stored: %v", err)
	}
	c.SetFail(nil)
	lost := errors.New("connection reset")
	c.SetAfter(func(ctx context.Context, op Op, key string, err error) error {
		if op == OpPut {
			return lost
		}
		return err
	})
	if _, err := c.Put(ctx, "c", strings.NewReader("3"), 1, bucket.Cond{}); !errors.Is(err, lost) {
		t.Fatalf("Put with a lost reply = %v", err)
	}
	if _, err := c.Head(ctx, "c"); err != nil {
		t.Fatalf("a put whose reply was lost was not stored: %v", err)
	}
	got := c.Counts()
	if got[OpPut] != 3 || got[OpHead] != 1 || c.Total() != 4 {
		t.Fatalf("counts %v", got)
	}
	c.Reset()
	if c.Total() != 0 {
		t.Fatal("Reset kept counts")
	}
}
