package check_test

import (
	"context"
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
	if !rep.OK() || len(rep.Races) != 6 || !strings.HasPrefix(rep.Verdict(), "OK") {
		t.Fatalf("verdict %q for a file bucket", rep.Verdict())
	}
	for _, r := range rep.Races {
		if r.Winners != 1 || r.Lost+r.Winners != r.Racers {
			t.Errorf("%s", r)
		}
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
