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

// failingDelete cannot delete, so the check cannot clean up.
type failingDelete struct{ bucket.Bucket }

func (failingDelete) Delete(context.Context, string, bucket.Cond) error {
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
	if !rep.OK() || len(rep.Races) != 9 || !strings.HasPrefix(rep.Verdict(), "OK") {
		t.Fatalf("verdict %q for a file bucket, %d races", rep.Verdict(), len(rep.Races))
	}
	kinds := map[string]int{}
	for _, r := range rep.Races {
		kinds[r.Kind]++
		want := 1
		if r.Kind == "if-match-missing" {
			want = 0
		}
		if r.Winners != want || r.Lost+r.Winners != r.Racers || !r.Stored {
			t.Errorf("%s", r)
		}
	}
	if kinds["if-none-match"] != 3 || kinds["if-match"] != 3 || kinds["if-match-missing"] != 3 {
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
