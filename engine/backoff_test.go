package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/internal/backoff"
	"github.com/lchat/lchat-caddy/spacestore"
)

// TestBackoffCurves: each thing that backs off waits by its own curve, as documented and
// as Retry-After tells clients: a table of failures counted to the wait that follows. The
// curve type itself is tested in internal/backoff.
func TestBackoffCurves(t *testing.T) {
	for _, tc := range []struct {
		name  string
		curve backoff.Curve
		waits map[int]time.Duration // consecutive failures: the wait after them
	}{
		{"failed wake", failedWakeBackoff, map[int]time.Duration{0: 0, 1: time.Second, 2: 2 * time.Second,
			3: 4 * time.Second, 7: 64 * time.Second, 8: 2 * time.Minute, 64: 2 * time.Minute, 1 << 20: 2 * time.Minute}},
		// The first crash wakes on the next request.
		{"crash", crashBackoff, map[int]time.Duration{0: 0, 1: 0, 2: time.Second, 3: 2 * time.Second,
			4: 4 * time.Second, 7: 32 * time.Second, 8: time.Minute, 50: time.Minute}},
		{"wake record", wakeRecordBackoff, map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 7: time.Minute}},
		{"wake delivery", wakeDeliveryBackoff, map[int]time.Duration{1: time.Second, 9: 256 * time.Second, 10: 5 * time.Minute}},
		{"ready probe", readyBackoff, map[int]time.Duration{1: 2 * time.Millisecond, 5: 32 * time.Millisecond, 6: 50 * time.Millisecond}},
		{"first answer", firstAnswerBackoff, map[int]time.Duration{1: 5 * time.Millisecond, 5: 80 * time.Millisecond, 6: 100 * time.Millisecond}},
	} {
		for n, want := range tc.waits {
			if got := tc.curve.After(n); got != want {
				t.Errorf("%s: after %d failures %v, want %v", tc.name, n, got, want)
			}
		}
	}
}

// flood sends requests for sp from 16 goroutines for d and returns the errors seen.
func flood(e *Engine, sp Space, d time.Duration) []error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				u, err := e.Acquire(context.Background(), sp)
				if u != nil {
					u.Release()
				}
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	return errs
}

// checkRefusals asserts every failed request was a 503-style RetryError whose Retry-After
// is the remaining backoff: positive and no longer than the longest backoff reached.
func checkRefusals(t *testing.T, errs []error, longest time.Duration) {
	t.Helper()
	for _, err := range errs {
		var re *RetryError
		if !errors.As(err, &re) {
			t.Fatalf("request during a failing wake = %v, want a RetryError", err)
		}
		if re.After <= 0 || re.After > longest {
			t.Fatalf("Retry-After %v, want within (0, %v]", re.After, longest)
		}
	}
}

// TestFailedWakeBacksOff: a flood of requests to a space whose wake fails (a corrupt blob,
// then a bucket that refuses everything) makes one wake attempt per backoff step, not one
// per request, and never puts the healthy awake space to sleep to make room. Once the
// cause is gone the next wake succeeds and the backoff starts over.
func TestFailedWakeBacksOff(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real instance")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "eng")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	e, c := newCountingEngine(t, Config{StateDir: dir, MaxAwake: 1, Kinds: map[string]Kind{"app": {
		Command:     self,
		Env:         map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
		Replication: Replication{Class: ReplicateSleep},
		StopGrace:   5 * time.Second,
	}}})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		e.Drain(ctx)
		e.Close()
	}()
	ctx := context.Background()

	// A healthy space holds the only awake slot, idle: a wake elsewhere may sleep it.
	healthy := Space{Host: "healthy.example.com", Kind: "app"}
	u, err := e.Acquire(ctx, healthy)
	if err != nil {
		t.Fatal(err)
	}
	u.Release()

	// The broken space's manifest names a blob whose bytes do not match their hash.
	const host = "broken.example.com"
	sum := sha256.Sum256([]byte("the real bytes"))
	hexSum := hex.EncodeToString(sum[:])
	if _, err := c.Bucket.Put(ctx, spacestore.BlobKey(host, hexSum), strings.NewReader("corrupted!"), 10, bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	if _, err := spacestore.WriteManifest(ctx, c.Bucket, host, &spacestore.Manifest{Generation: 1,
		Files: []spacestore.File{{Path: "notes.txt", Size: 14, SHA256: hexSum, Mode: 0o600}}}, ""); err != nil {
		t.Fatal(err)
	}
	var blobGets, leaseOps atomic.Int64
	var cut atomic.Bool
	c.SetFail(func(ctx context.Context, op membucket.Op, key string) error {
		if !strings.HasPrefix(key, "spaces/"+host+"/") {
			return nil
		}
		if op == membucket.OpGet && strings.Contains(key, "/blobs/") {
			blobGets.Add(1)
		}
		if strings.HasSuffix(key, "/lease") {
			leaseOps.Add(1)
		}
		if cut.Load() {
			return errors.New("injected: bucket unreachable")
		}
		return nil
	})
	broken := Space{Host: host, Kind: "app"}

	// 2.5 s of flood: attempts at 0 s, 1 s (backoff 1 s) and 3 s (2 s) at most: two.
	errs := flood(e, broken, 2500*time.Millisecond)
	checkRefusals(t, errs, 2*time.Second)
	if n := blobGets.Load(); n < 1 || n > 2 {
		t.Fatalf("corrupt blob: %d restore attempts under %d requests in 2.5 s, want 1 or 2", n, len(errs))
	}
	if st := stateOf(e.lookup(healthy.Host)); st != StateAwake {
		t.Fatalf("healthy space is %s after failed wakes of another, want awake (never slept to make room)", st)
	}

	// The bucket cut: each attempt is one lease request (which fails), once per backoff step. The
	// backoff went on growing (4 s next), so wait it out once, then flood.
	in := e.lookup(host)
	in.mu.Lock()
	in.retry = retryHold{} // skip the rest of the corrupt-blob backoff
	in.mu.Unlock()
	cut.Store(true)
	leaseOps.Store(0)
	errs = flood(e, broken, 2*time.Second)
	checkRefusals(t, errs, 8*time.Second)
	if n := leaseOps.Load(); n != 1 {
		t.Fatalf("bucket cut: %d wake attempts under %d requests in 2 s with a %v backoff, want 1", n, len(errs), failedWakeBackoff.After(4))
	}
	if got := e.Counters().WakeFailures; got < 3 {
		t.Fatalf("wake_failures = %d, want at least 3", got)
	}

	// Healed: fix the blob, let the backoff pass; the wake succeeds and resets it.
	cut.Store(false)
	if _, err := c.Bucket.Put(ctx, spacestore.BlobKey(host, hexSum), strings.NewReader("the real bytes"), 14, bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	in.mu.Lock()
	in.retry = retryHold{}
	in.mu.Unlock()
	u, err = e.Acquire(ctx, broken)
	if err != nil {
		t.Fatalf("wake after the fault healed: %v", err)
	}
	u.Release()
	in.mu.Lock()
	fails := in.wakeFails
	in.mu.Unlock()
	if fails != 0 {
		t.Fatalf("consecutive failures after a successful wake = %d, want 0", fails)
	}
}

// TestNotReadyWakeGetsOneCurve: a wake whose instance never gets ready is a failed wake and
// waits failedWakeBackoff's step, whatever crashes the space had before: not the crash
// curve as well (both were applied, and the longer won: a minute after ten crashes).
func TestNotReadyWakeGetsOneCurve(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real instance")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e, _ := newCountingEngine(t, Config{Kinds: map[string]Kind{"app": {
		Command:      self,
		Env:          map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1", "START_DELAY_MS": "600000"},
		ReadyTimeout: 200 * time.Millisecond,
		Replication:  Replication{Class: ReplicateSleep},
	}}})
	defer e.Close()
	sp := Space{Host: "slow.example.com", Kind: "app"}
	in := e.get(sp.Host)
	in.mu.Lock()
	in.crashes = 10 // the crash curve would wait a minute now
	in.mu.Unlock()
	_, err = e.Acquire(context.Background(), sp)
	var re *RetryError
	if !errors.As(err, &re) || re.Reason != "instance not ready" {
		t.Fatalf("wake of an instance that never gets ready: %v, want a RetryError (instance not ready)", err)
	}
	if want := failedWakeBackoff.After(1); re.After != want {
		t.Fatalf("Retry-After %v after the first failed wake, want %v (failedWakeBackoff only)", re.After, want)
	}
	_, err = e.Acquire(context.Background(), sp)
	if !errors.As(err, &re) || re.After > failedWakeBackoff.After(1) {
		t.Fatalf("the next request: %v, want refused for at most %v", err, failedWakeBackoff.After(1))
	}
	if st := stateOf(in); st != StateFailed {
		t.Fatalf("state %s, want failed", st)
	}
}
