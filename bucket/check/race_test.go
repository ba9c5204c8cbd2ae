package check

import (
	"context"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
)

// conflicting answers 409 to its first left writes (all of them when left < 0), as a
// store that refuses concurrent writers does.
type conflicting struct {
	bucket.Bucket
	mu   sync.Mutex
	left int
}

func (b *conflicting) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	b.mu.Lock()
	refuse := b.left != 0
	if b.left > 0 {
		b.left--
	}
	b.mu.Unlock()
	if refuse {
		return bucket.Info{}, bucket.ErrConflict
	}
	return b.Bucket.Put(ctx, key, body, size, cond)
}

// TestRaceRetriesConflicts: a write refused with 409 is retried after a random wait below
// conflictBackoff's bound, up to conflictRetries times, so a store that refuses
// concurrent writers still shows that exactly one can win, and one that refuses every
// write is reported, having waited no longer than the curve allows.
func TestRaceRetriesConflicts(t *testing.T) {
	var longest time.Duration // the most one racer may wait in all
	for n := 1; n <= conflictRetries; n++ {
		longest += conflictBackoff.After(n)
	}
	const racers = 8
	for _, tc := range []struct {
		name      string
		refuse    int // the first writes refused; < 0: all of them
		winners   int
		conflicts int
		errors    []string
	}{
		// No more refusals than one racer retries: none of them gives up.
		{"some refused", conflictRetries, 1, conflictRetries, nil},
		{"all refused", -1, 0, racers * (conflictRetries + 1), []string{"still conflicting after 10 retries"}},
	} {
		synctest.Test(t, func(t *testing.T) {
			b := &conflicting{Bucket: membucket.New(), left: tc.refuse}
			r := race(t.Context(), b, racers, "k", 1, func(int) bucket.Cond { return bucket.Cond{IfNoneMatch: true} })
			if r.Winners != tc.winners || r.Conflicts != tc.conflicts || len(r.Errors) != len(tc.errors) ||
				(len(tc.errors) > 0 && r.Errors[0] != tc.errors[0]) {
				t.Errorf("%s: %d winners, %d conflicts, errors %q; want %d, %d, %q",
					tc.name, r.Winners, r.Conflicts, r.Errors, tc.winners, tc.conflicts, tc.errors)
			}
			if r.Duration >= longest {
				t.Errorf("%s: the race took %v, want under %v (conflictBackoff's bounds)", tc.name, r.Duration, longest)
			}
			if tc.winners == 1 && !r.Stored {
				t.Errorf("%s: the winner's body is not what the store holds", tc.name)
			}
		})
	}
}
