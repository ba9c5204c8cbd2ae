package check_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/check"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// ignoresConditions is a store that accepts conditional headers and ignores them,
// as some S3-compatible stores do. The checker must catch it.
type ignoresConditions struct{ bucket.Bucket }

func (b ignoresConditions) Put(ctx context.Context, key string, body io.Reader, size int64, _ bucket.Cond) (bucket.Info, error) {
	return b.Bucket.Put(ctx, key, body, size, bucket.Cond{})
}

func (b ignoresConditions) Delete(ctx context.Context, key string, _ bucket.Cond) error {
	return b.Bucket.Delete(ctx, key, bucket.Cond{})
}

// ignoresDeleteConditions enforces conditional puts but deletes whatever If-Match says,
// as a store that implemented conditional writes and not conditional deletes might.
type ignoresDeleteConditions struct{ bucket.Bucket }

func (b ignoresDeleteConditions) Delete(ctx context.Context, key string, _ bucket.Cond) error {
	return b.Bucket.Delete(ctx, key, bucket.Cond{})
}

// ifMatchOnlyWhenPresent checks If-Match only against an existing key and lets an
// If-Match write to a missing key through, as a careless store might.
type ifMatchOnlyWhenPresent struct{ bucket.Bucket }

func (b ifMatchOnlyWhenPresent) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	if cond.IfMatch != "" {
		if _, err := b.Head(ctx, key); errors.Is(err, bucket.ErrNotFound) {
			cond = bucket.Cond{}
		}
	}
	return b.Bucket.Put(ctx, key, body, size, cond)
}

// failingDelete cannot delete unconditionally, so the check cannot clean up (its stale
// conditional deletes are still refused as they should be).
type failingDelete struct{ bucket.Bucket }

func (b failingDelete) Delete(ctx context.Context, key string, cond bucket.Cond) error {
	if cond.IfMatch != "" {
		return b.Bucket.Delete(ctx, key, cond)
	}
	return errors.New("access denied")
}

func fileBucket(t *testing.T) bucket.Bucket {
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func run(t *testing.T, b bucket.Bucket) check.Report {
	t.Helper()
	var lines []string
	rep, err := check.Run(context.Background(), b, check.Options{Progress: func(l string) { lines = append(lines, l) }})
	if err != nil {
		t.Fatalf("check.Run: %v", err)
	}
	if len(lines) != 1+len(rep.Races) {
		t.Errorf("%d progress lines for %d races", len(lines), len(rep.Races))
	}
	t.Log(strings.Join(lines, "\n") + "\n" + rep.Verdict())
	if rep.CleanupError != "" {
		t.Errorf("cleanup: %s", rep.CleanupError)
	}
	// The check leaves nothing behind.
	page, err := b.List(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Objects) != 0 {
		t.Errorf("check left %d objects, first %s", len(page.Objects), page.Objects[0].Key)
	}
	return rep
}

func TestFileBucketPasses(t *testing.T) {
	rep := run(t, fileBucket(t))
	if !rep.OK() || len(rep.Races) != 12 || !strings.HasPrefix(rep.Verdict(), "OK") {
		t.Fatalf("verdict %q for a file bucket, %d races", rep.Verdict(), len(rep.Races))
	}
	kinds := map[string]int{}
	for _, r := range rep.Races {
		kinds[r.Kind]++
		want := 1
		if r.Kind == "if-match-missing" || r.Kind == "delete-if-match-stale" {
			want = 0
		}
		if r.Winners != want || r.Lost+r.Winners != r.Racers || !r.Stored {
			t.Errorf("%s", r)
		}
	}
	if kinds["if-none-match"] != 3 || kinds["if-match"] != 3 || kinds["if-match-missing"] != 3 || kinds["delete-if-match-stale"] != 3 {
		t.Errorf("races by kind: %v, want 3 of each", kinds)
	}
}

func TestIfMatchOnMissingKeyAcceptedFails(t *testing.T) {
	rep := run(t, ifMatchOnlyWhenPresent{fileBucket(t)})
	if rep.OK() || !strings.HasPrefix(rep.Verdict(), "FAIL") {
		t.Fatalf("verdict %q for a store that lets If-Match create a missing key", rep.Verdict())
	}
	for _, r := range rep.Races {
		if ok := r.Kind != "if-match-missing"; r.OK() != ok {
			t.Errorf("%s: OK=%v, want %v", r, r.OK(), ok)
		}
	}
}

// TestStaleDeleteAcceptedFails: a store that enforces conditional puts but ignores
// If-Match on DELETE fails the check on the delete races alone.
func TestStaleDeleteAcceptedFails(t *testing.T) {
	rep := run(t, ignoresDeleteConditions{fileBucket(t)})
	if rep.OK() || !strings.HasPrefix(rep.Verdict(), "FAIL") {
		t.Fatalf("verdict %q for a store that ignores If-Match on DELETE", rep.Verdict())
	}
	for _, r := range rep.Races {
		if ok := r.Kind != "delete-if-match-stale"; r.OK() != ok {
			t.Errorf("%s: OK=%v, want %v", r, r.OK(), ok)
		}
	}
}

func TestCleanupErrorReported(t *testing.T) {
	b := fileBucket(t)
	rep, err := check.Run(context.Background(), failingDelete{b}, check.Options{Racers: 4, Rounds: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("verdict %q", rep.Verdict())
	}
	if !strings.Contains(rep.CleanupError, "access denied") || !strings.Contains(rep.CleanupError, rep.Scratch) {
		t.Fatalf("CleanupError = %q, want the delete failure under %s", rep.CleanupError, rep.Scratch)
	}
}

func TestVersitygwPasses(t *testing.T) {
	s3 := harness.StartS3(t)
	rep := run(t, s3.NewBucket(t, "check"))
	if !rep.OK() {
		t.Fatalf("verdict %q for versitygw", rep.Verdict())
	}
}

func TestIgnoredConditionsFail(t *testing.T) {
	for name, b := range map[string]bucket.Bucket{
		"file": ignoresConditions{fileBucket(t)},
		"s3":   ignoresConditions{harness.StartS3(t).NewBucket(t, "")},
	} {
		t.Run(name, func(t *testing.T) {
			rep := run(t, b)
			if rep.OK() || !strings.HasPrefix(rep.Verdict(), "FAIL") {
				t.Fatalf("verdict %q for a store that ignores conditions", rep.Verdict())
			}
			for _, r := range rep.Races {
				if r.Winners != r.Racers {
					t.Errorf("%s: %d winners of %d racers; a store ignoring conditions lets all win", r.Name, r.Winners, r.Racers)
				}
			}
		})
	}
}

// unwritable is a store that refuses every write, as with wrong credentials.
type unwritable struct{ bucket.Bucket }

func (b unwritable) Put(context.Context, string, io.Reader, int64, bucket.Cond) (bucket.Info, error) {
	return bucket.Info{}, errors.New("access denied")
}

// TestAtStart: the start-up check passes a store that enforces conditions, refuses
// (ErrIgnoresConditions, naming the races) one that ignores them, and reports a check
// that could not run without that sentinel, so the box only logs it.
func TestAtStart(t *testing.T) {
	ctx := context.Background()
	if _, err := check.AtStart(ctx, fileBucket(t)); err != nil {
		t.Fatalf("file bucket: %v", err)
	}
	_, err := check.AtStart(ctx, ignoresConditions{fileBucket(t)})
	if !errors.Is(err, check.ErrIgnoresConditions) || !strings.Contains(err.Error(), "if-none-match: 4 of 4 writers won, want 1") {
		t.Fatalf("ignoring store: %v, want ErrIgnoresConditions naming the races", err)
	}
	_, err = check.AtStart(ctx, unwritable{fileBucket(t)})
	if err == nil || errors.Is(err, check.ErrIgnoresConditions) {
		t.Fatalf("unwritable store: %v, want an error that is not a refusal", err)
	}
}
