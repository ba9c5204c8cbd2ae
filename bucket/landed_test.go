package bucket_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
)

// TestLanded: a write is recognized as landed exactly when the key holds its bytes, and
// then Landed names which of the writes in doubt it was and gives the object's ETag.
func TestLanded(t *testing.T) {
	mine := []byte(`{"gen":7,"nonce":"a1"}`)
	older := []byte(`{"gen":6,"nonce":"a0"}`)
	for _, tc := range []struct {
		name   string
		stored []byte // nil: the key is missing
		bodies [][]byte
		which  int
		ok     bool
	}{
		{"holds the write", mine, [][]byte{mine}, 0, true},
		{"holds an earlier write in doubt", older, [][]byte{older, mine}, 0, true},
		{"holds the later write in doubt", mine, [][]byte{older, mine}, 1, true},
		{"another writer's bytes", []byte(`{"gen":7,"nonce":"b1"}`), [][]byte{mine}, 0, false},
		{"the write and more", append(bytes.Clone(mine), ' '), [][]byte{mine}, 0, false},
		{"a prefix of the write", mine[:len(mine)-1], [][]byte{mine}, 0, false},
		{"an empty object", []byte{}, [][]byte{mine}, 0, false},
		{"missing", nil, [][]byte{mine}, 0, false},
		{"no write in doubt", mine, nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			b := membucket.New()
			var want string
			if tc.stored != nil {
				info, err := b.Put(ctx, "k", bytes.NewReader(tc.stored), int64(len(tc.stored)), bucket.Cond{})
				if err != nil {
					t.Fatal(err)
				}
				want = info.ETag
			}
			etag, which, ok := bucket.Landed(ctx, b, "k", tc.bodies...)
			if ok != tc.ok || (ok && (which != tc.which || etag != want)) {
				t.Fatalf("Landed = %q, %d, %v; want %q, %d, %v", etag, which, ok, want, tc.which, tc.ok)
			}
		})
	}
}

// TestLandedAfterLostAnswer is the case Landed exists for: a create the store applied
// but whose answer was lost fails its retry's condition, and Landed still tells the
// writer that the object is its own.
func TestLandedAfterLostAnswer(t *testing.T) {
	ctx := context.Background()
	b := membucket.NewCounting(membucket.New())
	lost := errors.New("connection reset after the request was sent")
	b.SetAfter(func(_ context.Context, op membucket.Op, _ string, err error) error {
		if op == membucket.OpPut && err == nil {
			return lost
		}
		return err
	})
	body := []byte("lease of box a, acquired at 12:00:00.123")
	if _, err := b.Put(ctx, "k", bytes.NewReader(body), int64(len(body)), bucket.Cond{IfNoneMatch: true}); !errors.Is(err, lost) {
		t.Fatalf("put = %v, want the lost answer", err)
	}
	b.SetAfter(nil)
	if _, err := b.Put(ctx, "k", bytes.NewReader(body), int64(len(body)), bucket.Cond{IfNoneMatch: true}); !errors.Is(err, bucket.ErrPreconditionFailed) {
		t.Fatalf("retried put = %v, want it to fail its own condition", err)
	}
	head, err := b.Head(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if etag, _, ok := bucket.Landed(ctx, b, "k", body); !ok || etag != head.ETag {
		t.Fatalf("Landed = %q, %v; want the stored object's ETag %q", etag, ok, head.ETag)
	}
}

// TestLandedReadFails: a read that fails is no evidence that the write landed, and with
// no write in doubt Landed sends no request at all.
func TestLandedReadFails(t *testing.T) {
	ctx := context.Background()
	b := membucket.NewCounting(membucket.New())
	body := []byte("x")
	if _, err := b.Put(ctx, "k", bytes.NewReader(body), 1, bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	if _, _, ok := bucket.Landed(ctx, b, "k"); ok || b.Total() != 0 {
		t.Fatalf("Landed with no bodies = %v after %d requests; want false after none", ok, b.Total())
	}
	b.SetFail(func(context.Context, membucket.Op, string) error { return errors.New("bucket unreachable") })
	if _, _, ok := bucket.Landed(ctx, b, "k", body); ok {
		t.Fatal("Landed reported a write as landed although the read failed")
	}
}
