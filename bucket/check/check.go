// Package check proves that a bucket enforces conditional writes: it races many
// If-None-Match creates of one key, many If-Match swaps from one ETag, many If-Match
// writes to a missing key and many If-Match deletes with a stale ETag, and reports how
// many writers won each race. A lease is only as good as this: some S3-compatible stores
// accept the headers and ignore them, and then every racer wins; others check If-Match
// only when the key exists, and then a lease released meanwhile could be taken over and
// created at once; a store that ignores If-Match on DELETE lets a stale holder remove
// another's certificate lock.
// Both `lchat-caddy bucket-check` and the tests use it.
package check

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/internal/backoff"
)

// Options tunes a check. The zero value is the default check.
type Options struct {
	// Racers is the number of concurrent writers per race. Default 32.
	Racers int
	// Rounds is the number of races of each kind. Default 3.
	Rounds int
	// Scratch is the prefix the check writes under; a random directory below it is
	// used and removed afterwards. Default "bucket-check/".
	Scratch string
	// Progress, when set, is called with a line of text as each step finishes.
	Progress func(line string)
	// CleanupTimeout bounds removing the scratch keys afterwards. Default 1m.
	CleanupTimeout time.Duration
}

// Race is the outcome of one race.
type Race struct {
	// Name is "create #1", "swap #2", ...
	Name string `json:"name"`
	// Kind is "if-none-match", "if-match", "if-match-missing" or "delete-if-match-stale".
	Kind string `json:"kind"`
	Key  string `json:"key"`
	// Racers is how many writers took part; Winners how many writes succeeded, and
	// Want how many must: 1, or 0 for If-Match writes to a missing key and deletes
	// with a stale ETag.
	Racers  int `json:"racers"`
	Winners int `json:"winners"`
	Want    int `json:"want_winners"`
	// Lost counts 412 answers; Conflicts counts 409 answers, which were retried.
	Lost      int `json:"lost"`
	Conflicts int `json:"conflicts"`
	// Errors holds other failures (at most a few, de-duplicated).
	Errors []string `json:"errors,omitempty"`
	// Stored reports whether the store was left as the outcome says: holding the
	// single winner's write, or (when no writer may win) without the key.
	Stored   bool          `json:"stored_matches_winner"`
	Duration time.Duration `json:"duration"`
}

// OK reports whether exactly the wanted number of writers won and the store was
// left accordingly.
func (r Race) OK() bool { return r.Winners == r.Want && r.Stored && len(r.Errors) == 0 }

func (r Race) String() string {
	verdict := "ok"
	if !r.OK() {
		verdict = "FAIL"
	}
	s := fmt.Sprintf("%-10s %-16s %d racers: %d winner(s) (want %d), %d precondition failed, %d conflicts retried (%s) %s",
		r.Name, r.Kind, r.Racers, r.Winners, r.Want, r.Lost, r.Conflicts, r.Duration.Round(time.Millisecond), verdict)
	switch {
	case r.Want == 1 && r.Winners == 1 && !r.Stored:
		s += "; the stored object is not the winner's write"
	case r.Want == 0 && r.Winners == 0 && !r.Stored && r.Kind == "delete-if-match-stale":
		s += "; every delete was refused, yet the key no longer holds the current object"
	case r.Want == 0 && r.Winners == 0 && !r.Stored:
		s += "; every write was refused, yet the key exists"
	}
	for _, e := range r.Errors {
		s += "\n    error: " + e
	}
	return s
}

// Report is the result of a check.
type Report struct {
	Bucket  string `json:"bucket"`
	Scratch string `json:"scratch"`
	Races   []Race `json:"races"`
	// CleanupError is set when the scratch keys could not all be removed.
	CleanupError string `json:"cleanup_error,omitempty"`
}

// OK reports whether every race had exactly the winners it wanted.
func (r Report) OK() bool {
	if len(r.Races) == 0 {
		return false
	}
	for _, race := range r.Races {
		if !race.OK() {
			return false
		}
	}
	return true
}

// Verdict is a one-line summary.
func (r Report) Verdict() string {
	if r.OK() {
		return fmt.Sprintf("OK: %s enforces conditional writes (%d races: exactly one winner per create and swap, none on a missing key or with a stale ETag)", r.Bucket, len(r.Races))
	}
	bad := 0
	for _, race := range r.Races {
		if !race.OK() {
			bad++
		}
	}
	return fmt.Sprintf("FAIL: %s does not enforce conditional writes reliably (%d of %d races without the right winners); do not trust leases to it", r.Bucket, bad, len(r.Races))
}

// Run races conditional writes against b under a fresh scratch prefix and removes
// what it wrote. The error is for a check that could not run (no access, a setup
// write failing); a bucket that lets several writers win is a Report that is not OK.
func Run(ctx context.Context, b bucket.Bucket, opts Options) (rep Report, err error) {
	if opts.Racers <= 0 {
		opts.Racers = 32
	}
	if opts.Rounds <= 0 {
		opts.Rounds = 3
	}
	if opts.Scratch == "" {
		opts.Scratch = "bucket-check/"
	}
	if !strings.HasSuffix(opts.Scratch, "/") {
		opts.Scratch += "/"
	}
	progress := opts.Progress
	if progress == nil {
		progress = func(string) {}
	}
	rnd := make([]byte, 8)
	rand.Read(rnd)
	scratch := opts.Scratch + hex.EncodeToString(rnd) + "/"
	if err := bucket.CheckPrefix(scratch); err != nil {
		return Report{}, fmt.Errorf("scratch prefix: %w", err)
	}
	rep = Report{Bucket: b.String(), Scratch: scratch}
	// rep is a named result, so the cleanup outcome reaches the caller.
	defer func() {
		if cerr := cleanup(context.WithoutCancel(ctx), b, scratch, opts.CleanupTimeout); cerr != nil {
			rep.CleanupError = cerr.Error()
		}
	}()
	progress(fmt.Sprintf("checking %s under %s: %d rounds of %d racers", b, scratch, opts.Rounds, opts.Racers))
	// A bucket that cannot be written at all (wrong name, credentials, endpoint) is
	// a check that could not run, not a race result.
	if _, err := b.Put(ctx, scratch+"probe", strings.NewReader("probe"), 5, bucket.Cond{}); err != nil {
		return rep, fmt.Errorf("writing a probe object: %w", err)
	}

	for round := 1; round <= opts.Rounds; round++ {
		key := fmt.Sprintf("%screate-%d", scratch, round)
		r := race(ctx, b, opts.Racers, key, 1, func(i int) bucket.Cond { return bucket.Cond{IfNoneMatch: true} })
		r.Name, r.Kind = fmt.Sprintf("create #%d", round), "if-none-match"
		rep.Races = append(rep.Races, r)
		progress(r.String())
		if err := ctx.Err(); err != nil {
			return rep, err
		}
	}
	for round := 1; round <= opts.Rounds; round++ {
		key := fmt.Sprintf("%sswap-%d", scratch, round)
		base, err := b.Put(ctx, key, strings.NewReader("base"), 4, bucket.Cond{})
		if err != nil {
			return rep, fmt.Errorf("writing the swap base object: %w", err)
		}
		r := race(ctx, b, opts.Racers, key, 1, func(i int) bucket.Cond { return bucket.Cond{IfMatch: base.ETag} })
		r.Name, r.Kind = fmt.Sprintf("swap #%d", round), "if-match"
		rep.Races = append(rep.Races, r)
		progress(r.String())
		if err := ctx.Err(); err != nil {
			return rep, err
		}
	}
	// A lease released (deleted) while a peer takes it over with If-Match on the old
	// ETag must not come back: If-Match on a missing key is refused.
	for round := 1; round <= opts.Rounds; round++ {
		key := fmt.Sprintf("%smissing-%d", scratch, round)
		r := race(ctx, b, opts.Racers, key, 0, func(i int) bucket.Cond { return bucket.Cond{IfMatch: absentETag} })
		r.Name, r.Kind = fmt.Sprintf("missing #%d", round), "if-match-missing"
		rep.Races = append(rep.Races, r)
		progress(r.String())
		if err := ctx.Err(); err != nil {
			return rep, err
		}
	}
	// A certificate lock or a scheduled wake is deleted with If-Match on the ETag its
	// holder saw: once another writer replaced the object, that delete must be refused,
	// or a stale holder removes the new holder's lock.
	for round := 1; round <= opts.Rounds; round++ {
		key := fmt.Sprintf("%sstale-delete-%d", scratch, round)
		old, err := b.Put(ctx, key, strings.NewReader("old"), 3, bucket.Cond{})
		if err != nil {
			return rep, fmt.Errorf("writing the delete base object: %w", err)
		}
		if _, err := b.Put(ctx, key, strings.NewReader("current"), 7, bucket.Cond{}); err != nil {
			return rep, fmt.Errorf("replacing the delete base object: %w", err)
		}
		r := raceDelete(ctx, b, opts.Racers, key, old.ETag, "current")
		r.Name, r.Kind = fmt.Sprintf("delete #%d", round), "delete-if-match-stale"
		rep.Races = append(rep.Races, r)
		progress(r.String())
		if err := ctx.Err(); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// raceDelete releases n deleters of key at once, each with If-Match on stale, an ETag
// the key no longer has: none may win, and the key must still hold current.
func raceDelete(ctx context.Context, b bucket.Bucket, n int, key, stale, current string) Race {
	r := Race{Key: key, Racers: n, Want: 0}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		errSeen = map[string]bool{}
	)
	start := make(chan struct{})
	begin := time.Now()
	for range n {
		wg.Go(func() {
			<-start
			err := b.Delete(ctx, key, bucket.Cond{IfMatch: stale})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				r.Winners++
			case errors.Is(err, bucket.ErrPreconditionFailed):
				r.Lost++
			case errors.Is(err, bucket.ErrConflict):
				r.Conflicts++
				r.Lost++
			default:
				r.Errors = appendOnce(r.Errors, errSeen, err.Error())
			}
		})
	}
	close(start)
	wg.Wait()
	r.Duration = time.Since(begin)
	obj, err := b.Get(ctx, key)
	switch {
	case errors.Is(err, bucket.ErrNotFound):
	case err != nil:
		r.Errors = append(r.Errors, "reading the result: "+err.Error())
	default:
		data, err := io.ReadAll(io.LimitReader(obj.Body, 64))
		obj.Body.Close()
		r.Stored = err == nil && string(data) == current
	}
	return r
}

// absentETag is the If-Match value of writes to a missing key: a well-formed MD5 ETag
// that no write of the check produces.
const absentETag = `"00000000000000000000000000000000"`

// conflictBackoff bounds a racer's wait before it retries a write the store refused with
// 409 (race): the wait is drawn at random below conflictBackoff.After(n) after n
// conflicts, so retried writers do not collide again in step; the bound is 10ms, doubling
// to 100ms, for at most conflictRetries retries.
var conflictBackoff = backoff.Curve{First: 10 * time.Millisecond, Max: 100 * time.Millisecond}

// conflictRetries is how many times a racer retries a write refused with 409.
const conflictRetries = 10

// race releases n writers at once, each putting its own body under key with cond;
// want is how many may win (1, or 0 when the key is missing and cond is If-Match).
// A 409 (the store saw the concurrent writes and refused this one, retryable) is
// retried with the same condition, so a store that refuses every concurrent writer
// still gets to show that exactly one can win.
func race(ctx context.Context, b bucket.Bucket, n int, key string, want int, cond func(i int) bucket.Cond) Race {
	r := Race{Key: key, Racers: n, Want: want}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []int
		errSeen = map[string]bool{}
	)
	start := make(chan struct{})
	begin := time.Now()
	for i := range n {
		wg.Go(func() {
			<-start
			body := fmt.Sprintf("racer %d", i)
			for try := 0; ; try++ {
				_, err := b.Put(ctx, key, strings.NewReader(body), int64(len(body)), cond(i))
				mu.Lock()
				switch {
				case err == nil:
					winners = append(winners, i)
				case errors.Is(err, bucket.ErrConflict):
					r.Conflicts++
					if try < conflictRetries {
						mu.Unlock()
						select {
						case <-ctx.Done():
						case <-time.After(mrand.N(conflictBackoff.After(try + 1))):
						}
						continue
					}
					r.Errors = appendOnce(r.Errors, errSeen, fmt.Sprintf("still conflicting after %d retries", conflictRetries))
				case errors.Is(err, bucket.ErrPreconditionFailed):
					r.Lost++
				default:
					r.Errors = appendOnce(r.Errors, errSeen, err.Error())
				}
				mu.Unlock()
				return
			}
		})
	}
	close(start)
	wg.Wait()
	r.Duration = time.Since(begin)
	r.Winners = len(winners)
	if r.Want == 0 && len(winners) == 0 {
		_, err := b.Head(ctx, key)
		switch {
		case errors.Is(err, bucket.ErrNotFound):
			r.Stored = true
		case err != nil:
			r.Errors = append(r.Errors, "reading the result: "+err.Error())
		}
	}
	if r.Want == 1 && len(winners) == 1 {
		if obj, err := b.Get(ctx, key); err == nil {
			data, err := io.ReadAll(io.LimitReader(obj.Body, 64))
			obj.Body.Close()
			r.Stored = err == nil && string(data) == fmt.Sprintf("racer %d", winners[0])
		} else {
			r.Errors = append(r.Errors, "reading the result: "+err.Error())
		}
	}
	return r
}

func appendOnce(list []string, seen map[string]bool, s string) []string {
	if seen[s] || len(list) >= 5 {
		return list
	}
	seen[s] = true
	return append(list, s)
}

// cleanup deletes every key under prefix.
func cleanup(ctx context.Context, b bucket.Bucket, prefix string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var failed error
	for {
		// Always list from the start: the keys of the last page are gone.
		page, err := b.List(ctx, prefix, "")
		if err != nil {
			return fmt.Errorf("listing scratch keys: %v", err)
		}
		for _, o := range page.Objects {
			if err := b.Delete(ctx, o.Key, bucket.Cond{}); err != nil {
				failed = fmt.Errorf("deleting scratch key %s: %v", o.Key, err)
			}
		}
		if failed != nil || page.NextToken == "" {
			return failed
		}
	}
}

// ErrIgnoresConditions is AtStart's refusal: the store let more (or fewer) writers win
// a conditional race than it must, so a lease, a manifest swap or an id block on it
// could be won twice.
var ErrIgnoresConditions = errors.New("the bucket does not enforce conditional writes")

// AtStart is the quick check a box runs before it serves: one round of each race with 4
// racers, under "bucket-check/start/". It fails with ErrIgnoresConditions, naming the
// races, only on proof: a race with the wrong number of winners. A check that could not
// run (the store unreachable, no permission) or met errors is returned as the error
// without that sentinel, for the caller to log: leases fail closed on such a store anyway.
func AtStart(ctx context.Context, b bucket.Bucket) (Report, error) {
	rep, err := Run(ctx, b, Options{Racers: 4, Rounds: 1, Scratch: "bucket-check/start/", CleanupTimeout: 5 * time.Second})
	var wrong []string
	for _, r := range rep.Races {
		if r.Winners != r.Want {
			wrong = append(wrong, fmt.Sprintf("%s: %d of %d writers won, want %d", r.Kind, r.Winners, r.Racers, r.Want))
		}
	}
	if len(wrong) > 0 {
		return rep, fmt.Errorf("%w: %s (lchat-caddy bucket-check gives the details)", ErrIgnoresConditions, strings.Join(wrong, "; "))
	}
	if err == nil && !rep.OK() {
		err = errors.New(rep.Verdict())
	}
	return rep, err
}
