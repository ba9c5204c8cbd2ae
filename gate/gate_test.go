package gate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

var errFlaky = errors.New("bucket: 500")

// fakeLog is the one scripted log of these tests: each Ship counts itself, then blocks
// until the test answers it (answer) or its ctx ends.
type fakeLog struct {
	started atomic.Int64
	results chan error
}

func newFakeLog() *fakeLog { return &fakeLog{results: make(chan error)} }

func (l *fakeLog) ship(ctx context.Context) error {
	l.started.Add(1)
	select {
	case err := <-l.results:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// answer ends the Ship in flight with err, blocking until one takes it (in a synctest
// bubble, a missing Ship is a deadlock, which fails the test).
func (l *fakeLog) answer(err error) { l.results <- err }

// waiters runs Waits on goroutines and keeps what each returned.
type waiters struct {
	mu   sync.Mutex
	errs []error // one per Wait that returned
}

func (ws *waiters) start(g *Gate, ctx context.Context) {
	go func() {
		err := g.Wait(ctx)
		ws.mu.Lock()
		ws.errs = append(ws.errs, err)
		ws.mu.Unlock()
	}()
}

// counts are how many Waits returned nil and how many an error, and the errors.
func (ws *waiters) counts() (ok, failed int, errs []error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, err := range ws.errs {
		if err == nil {
			ok++
		} else {
			failed++
			errs = append(errs, err)
		}
	}
	return ok, failed, errs
}

// gateOp is one step of a gate scenario, then what must hold once everything settled.
type gateOp struct {
	arrive   int           // this many waiters call Wait
	deadline time.Duration // their ctx's deadline from now; 0 none
	answer   bool          // end the Ship in flight with result
	result   error
	sleep    time.Duration // let fake time pass

	ships, ok, failed int // Ships started, Waits returned nil, Waits failed: so far
}

// TestGate: a table of scenarios, each a script of waiters arriving, Ships answered and
// time passing, checked after each step for the Ships started and the waiters released
// or failed: a waiter is released only by a Ship that started after it; waiters that
// arrive during a Ship share the next one; nothing ships without a waiter; a failed Ship
// is retried while waiters remain; a deadline fails a waiter with ErrNotDurable; a fence
// fails every waiter at once and ends shipping.
func TestGate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ops   []gateOp
		errIs []error // every failed Wait's error matches each
	}{
		{name: "no waiter, no ship", ops: []gateOp{
			{sleep: time.Hour, ships: 0},
		}},
		{name: "a ship in flight does not release a later waiter", ops: []gateOp{
			{arrive: 1, ships: 1},
			{arrive: 1, ships: 1},
			{answer: true, ships: 2, ok: 1}, // the first is out; the second needs its own
			{answer: true, ships: 2, ok: 2},
			{sleep: time.Hour, ships: 2, ok: 2},
		}},
		{name: "64 waiters during a ship share the next one", ops: []gateOp{
			{arrive: 1, ships: 1},
			{arrive: 64, ships: 1},
			{answer: true, ships: 2, ok: 1},
			{answer: true, ships: 2, ok: 65},
			{sleep: time.Hour, ships: 2, ok: 65},
		}},
		{name: "a failed ship is retried, then releases", ops: []gateOp{
			{arrive: 3, ships: 1},
			{answer: true, result: errFlaky, ships: 2}, // the first retry is at once
			{answer: true, result: errFlaky, ships: 2}, // the next waits shipBackoff.First
			{sleep: shipBackoff.First - time.Millisecond, ships: 2},
			{sleep: time.Millisecond, ships: 3},
			{arrive: 1, ships: 3}, // after Ship 3 started: needs Ship 4
			{answer: true, ships: 4, ok: 3},
			{answer: true, ships: 4, ok: 4},
		}},
		{name: "a waiter whose ship started after it is released by a retry", ops: []gateOp{
			{arrive: 1, ships: 1},
			{arrive: 1, ships: 1},
			{answer: true, result: errFlaky, ships: 2}, // Ship 2 covers both
			{answer: true, ships: 2, ok: 2},
		}},
		{name: "a waiter past its deadline is not durable; shipping stops with it", ops: []gateOp{
			{arrive: 1, deadline: 10 * time.Second, ships: 1},
			{answer: true, result: errFlaky, ships: 2},
			{sleep: 10 * time.Second, ships: 2, failed: 1},
			{answer: true, result: errFlaky, ships: 2, failed: 1}, // no waiter left: no retry
			{sleep: time.Hour, ships: 2, failed: 1},
		}, errIs: []error{ErrNotDurable, context.DeadlineExceeded, errFlaky}},
		{name: "a fence fails every waiter at once and nothing ships again", ops: []gateOp{
			{arrive: 1, ships: 1},
			{arrive: 5, ships: 1},
			{answer: true, result: fmt.Errorf("putting segment 7: %w", ErrFenced), ships: 1, failed: 6},
			{arrive: 2, ships: 1, failed: 8},
			{sleep: time.Hour, ships: 1, failed: 8},
		}, errIs: []error{ErrNotDurable, ErrFenced}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				log := newFakeLog()
				g := New(Config{Ship: log.ship})
				defer g.Close(nil)
				var ws waiters
				var cancels []context.CancelFunc
				defer func() {
					for _, c := range cancels {
						c()
					}
				}()
				for i, op := range tc.ops {
					for range op.arrive {
						ctx, cancel := context.Background(), context.CancelFunc(func() {})
						if op.deadline > 0 {
							ctx, cancel = context.WithTimeout(ctx, op.deadline)
						}
						cancels = append(cancels, cancel)
						ws.start(g, ctx)
						synctest.Wait() // each arrives in turn
					}
					if op.answer {
						log.answer(op.result)
					}
					if op.sleep > 0 {
						time.Sleep(op.sleep)
					}
					synctest.Wait()
					ok, failed, _ := ws.counts()
					if ships := int(log.started.Load()); ships != op.ships || ok != op.ok || failed != op.failed {
						t.Fatalf("step %d %+v: ships %d, released %d, failed %d", i, op, ships, ok, failed)
					}
				}
				_, _, errs := ws.counts()
				for _, err := range errs {
					for _, want := range tc.errIs {
						if !errors.Is(err, want) {
							t.Errorf("wait error %q does not match %q", err, want)
						}
					}
				}
			})
		})
	}
}

// TestClose: Close fails the waiters held and every later one with ErrClosed (or its
// error), ends the Ship in flight through its ctx, and returns once no Ship runs.
func TestClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newFakeLog()
		g := New(Config{Ship: log.ship})
		var ws waiters
		for range 3 {
			ws.start(g, context.Background())
		}
		synctest.Wait()
		g.Close(nil)
		synctest.Wait()
		if ok, failed, errs := ws.counts(); ok != 0 || failed != 3 || !errors.Is(errs[0], ErrNotDurable) || !errors.Is(errs[0], ErrClosed) {
			t.Fatalf("after Close: released %d, failed %d %v", ok, failed, errs)
		}
		if err := g.Wait(context.Background()); !errors.Is(err, ErrClosed) {
			t.Fatalf("Wait after Close = %v", err)
		}
		g.Close(errors.New("second")) // idempotent: the first error stands
		if s := g.Stats(); s.Ships != 1 || s.ShipErrors != 1 || !errors.Is(s.Closed, ErrClosed) || log.started.Load() != 1 {
			t.Fatalf("stats %+v, ships started %d", s, log.started.Load())
		}
	})
}

// TestShipPanicIsRetried: a panic in Ship is a failed Ship, retried; the gate lives on.
func TestShipPanicIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		g := New(Config{Ship: func(context.Context) error {
			if calls.Add(1) == 1 {
				panic("bad log")
			}
			return nil
		}})
		defer g.Close(nil)
		if err := g.Wait(context.Background()); err != nil {
			t.Fatalf("Wait = %v", err)
		}
		if s := g.Stats(); s.Ships != 2 || s.ShipErrors != 1 {
			t.Fatalf("stats %+v", s)
		}
	})
}

// TestStats: the durable lag is the oldest held waiter's age (0 with none), and the wait
// percentiles are how long waiters were held.
func TestStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newFakeLog()
		g := New(Config{Ship: log.ship})
		defer g.Close(nil)
		var ws waiters
		ws.start(g, context.Background()) // held 30ms: Ship 1
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		ws.start(g, context.Background()) // held 20ms + 40ms: Ship 2
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		if s := g.Stats(); s.Lag != 30*time.Millisecond || s.Waiting != 2 {
			t.Fatalf("two held: %+v", s)
		}
		log.answer(nil)
		synctest.Wait()
		if s := g.Stats(); s.Lag != 20*time.Millisecond || s.Waiting != 1 || s.WaitP50 != 30*time.Millisecond {
			t.Fatalf("one held: %+v", s)
		}
		time.Sleep(40 * time.Millisecond)
		log.answer(errFlaky)
		synctest.Wait()
		log.answer(nil) // the retry, at once
		synctest.Wait()
		s := g.Stats()
		want := Stats{Waits: 2, WaitP50: 30 * time.Millisecond, WaitP99: 60 * time.Millisecond, Ships: 3, ShipErrors: 1}
		if s != want {
			t.Fatalf("stats %+v, want %+v", s, want)
		}
	})
}

// TestPercentiles pins the nearest-rank percentiles and the window's wrap.
func TestPercentiles(t *testing.T) {
	for _, tc := range []struct {
		n        int // waits of 1ms, 2ms, ... n ms
		p50, p99 time.Duration
	}{
		{0, 0, 0},
		{1, time.Millisecond, time.Millisecond},
		{100, 50 * time.Millisecond, 99 * time.Millisecond},
		{statsWindow + 100, (100 + statsWindow/2) * time.Millisecond, (100 + 1014) * time.Millisecond},
	} {
		var c counters
		for i := 1; i <= tc.n; i++ {
			c.waited(time.Duration(i)*time.Millisecond, true)
		}
		if p50, p99 := c.percentiles(); p50 != tc.p50 || p99 != tc.p99 {
			t.Errorf("%d waits: p50 %v p99 %v, want %v %v", tc.n, p50, p99, tc.p50, tc.p99)
		}
	}
}

// BenchmarkGateWait: the cost of a Wait with an instant Ship, one waiter at a time and
// 64 at once, and 64 at once over a Ship that takes 1ms (a bucket PUT is slower still),
// where ships/op shows the group commit.
func BenchmarkGateWait(b *testing.B) {
	for _, bc := range []struct {
		ship     time.Duration
		parallel int
	}{{0, 1}, {0, 64}, {time.Millisecond, 64}} {
		b.Run(fmt.Sprintf("ship=%v/waiters=%d", bc.ship, bc.parallel), func(b *testing.B) {
			var ships atomic.Int64
			g := New(Config{Ship: func(context.Context) error {
				ships.Add(1)
				if bc.ship > 0 {
					time.Sleep(bc.ship) // the bucket's latency, not a wait on a condition
				}
				return nil
			}})
			defer g.Close(nil)
			ctx := context.Background()
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range bc.parallel {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						if err := g.Wait(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(ships.Load())/float64(b.N), "ships/op")
		})
	}
}
