package spacestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// lostAnswer applies a Put to the store and then loses its answer: the next matching Put
// lands, and the caller sees an error instead of the new ETag. With retry set it behaves
// like an SDK that retries a request whose answer it did not get: the identical
// conditional Put is sent again, fails its condition (the first one landed), and that
// failure is what the caller sees.
type lostAnswer struct {
	bucket.Bucket
	suffix string
	retry  bool
	armed  atomic.Int32
}

func (l *lostAnswer) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	if !strings.HasSuffix(key, l.suffix) || l.armed.Add(-1) < 0 {
		return l.Bucket.Put(ctx, key, body, size, cond)
	}
	data, _ := io.ReadAll(body)
	if _, err := l.Bucket.Put(ctx, key, bytes.NewReader(data), int64(len(data)), cond); err != nil {
		return bucket.Info{}, err
	}
	if l.retry {
		return l.Bucket.Put(ctx, key, bytes.NewReader(data), int64(len(data)), cond)
	}
	return bucket.Info{}, errors.New("injected: connection reset after the request was sent")
}

// TestManifestSwapWithLostAnswer: a checkpoint whose manifest write landed but whose
// answer was lost is recognized as this box's own write, on the SDK's retry and on the
// next checkpoint, instead of being read as another writer's win (a fence, which kills
// a healthy instance).
func TestManifestSwapWithLostAnswer(t *testing.T) {
	for _, retry := range []bool{false, true} {
		name := map[bool]string{false: "next checkpoint", true: "retried request"}[retry]
		t.Run(name, func(t *testing.T) {
			forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
				ctx := context.Background()
				lb := &lostAnswer{Bucket: b, suffix: "/manifest", retry: retry}
				s := newSyncer(t, lb, t.TempDir())
				if err := s.Load(ctx); err != nil {
					t.Fatal(err)
				}
				os.MkdirAll(s.DataDir, 0o700)
				write := func(body string) {
					os.WriteFile(filepath.Join(s.DataDir, "notes.txt"), []byte(body), 0o600)
				}
				write("one")
				if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
					t.Fatal(err)
				}
				write("two")
				lb.armed.Store(1)
				_, err := s.Checkpoint(ctx, Periodic, nil, time.Now())
				if errors.Is(err, ErrFenced) {
					t.Fatalf("checkpoint whose own write landed: %v, want it recognized", err)
				}
				if retry && err != nil {
					t.Fatalf("checkpoint with a retried request: %v", err)
				}
				write("three")
				if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
					t.Fatalf("checkpoint after a lost answer: %v, want success", err)
				}
				m, _, err := ReadManifest(ctx, b, "s.test")
				if err != nil || m == nil || m.Generation != 3 {
					t.Fatalf("manifest after the lost answer = %+v %v, want generation 3", m, err)
				}
				if sum := fmt.Sprintf("%x", sha256Sum("three")); m.Files[0].SHA256 != sum {
					t.Fatal("bucket does not hold the last checkpoint")
				}
				// Another writer's swap is still a fence.
				if _, err := WriteManifest(ctx, b, "s.test", &Manifest{Generation: 9, WrittenBy: "other"}, mustETag(t, b)); err != nil {
					t.Fatal(err)
				}
				write("four")
				if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); !errors.Is(err, ErrFenced) {
					t.Fatalf("checkpoint after another writer's swap = %v, want ErrFenced", err)
				}
			})
		})
	}
}

// TestLeaseReleaseWithLostAnswer: a release that landed but whose answer was lost is a
// release, not a lost lease.
func TestLeaseReleaseWithLostAnswer(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		lb := &lostAnswer{Bucket: b, suffix: "/lease", retry: true}
		h := Holder{ID: "https://a", Incarnation: "1"}
		etag, err := AcquireLease(ctx, lb, "l.test", h, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		lb.armed.Store(1)
		if _, err := ReleaseLease(ctx, lb, "l.test", etag, h, time.Now()); err != nil {
			t.Fatalf("release whose answer was lost: %v, want success", err)
		}
		if l, _, _ := ReadLease(ctx, b, "l.test"); !l.Released {
			t.Fatalf("lease %+v, want released", l)
		}
	})
}

func mustETag(t *testing.T, b bucket.Bucket) string {
	t.Helper()
	info, err := b.Head(context.Background(), ManifestKey("s.test"))
	if err != nil {
		t.Fatal(err)
	}
	return info.ETag
}
