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

// fakeLog is the one scripted log of these tests. Each Cut counts itself and takes the
// next of cutErrs, if any, as its result; a successful one is shipment id 1, 2, ... (a
// failed Cut takes no id), whose Land counts itself, then blocks until the test answers
// that shipment (answer, answerID) or its ctx ends. With empty set, a Cut finds nothing new.
type fakeLog struct {
	mu      sync.Mutex
	cuts    int          // Cut calls
	ids     int          // shipments cut
	lands   int          // Land calls
	landed  map[int]bool // shipments that landed
	results map[int]chan error
	cutErrs []error
	empty   bool
}

func newFakeLog() *fakeLog {
	return &fakeLog{landed: make(map[int]bool), results: make(map[int]chan error)}
}

// config is a Config over the log, with depth shipments landing at once.
func (l *fakeLog) config(depth int) Config {
	return Config{Cut: l.cut, Depth: depth}
}

func (l *fakeLog) cut(ctx context.Context) (Land, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cuts++
	if len(l.cutErrs) > 0 {
		err := l.cutErrs[0]
		l.cutErrs = l.cutErrs[1:]
		return nil, err
	}
	if l.empty {
		return nil, nil
	}
	l.ids++
	id := l.ids
	ch := make(chan error)
	l.results[id] = ch
	return func(ctx context.Context) error {
		l.mu.Lock()
		l.lands++
		l.mu.Unlock()
		select {
		case err := <-ch:
			if err == nil {
				l.mu.Lock()
				l.landed[id] = true
				l.mu.Unlock()
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}, nil
}

// answerID ends a Land of shipment id with err, blocking until one takes it (in a
// synctest bubble, a missing Land is a deadlock, which fails the test).
func (l *fakeLog) answerID(id int, err error) {
	l.mu.Lock()
	ch := l.results[id]
	l.mu.Unlock()
	ch <- err
}

// answer ends a Land of the oldest shipment not landed with err (call synctest.Wait
// between two answers: the Land marks itself landed once it has taken its answer).
func (l *fakeLog) answer(err error) {
	l.mu.Lock()
	id := 1
	for l.landed[id] {
		id++
	}
	l.mu.Unlock()
	l.answerID(id, err)
}

// counts are the Cut calls, shipments cut and Land calls so far.
func (l *fakeLog) counts() (cuts, ids, lands int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cuts, l.ids, l.lands
}

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
	cutErrs  []error       // the next Cuts fail with these, in order
	empty    bool          // from now on a Cut finds nothing new
	arrive   int           // this many waiters call Wait
	deadline time.Duration // their ctx's deadline from now; 0 none
	answer   int           // end a Land of this shipment with result
	result   error
	sleep    time.Duration // let fake time pass

	cuts, ids, lands, ok, failed int // Cuts, shipments cut, Lands, Waits returned nil, Waits failed: so far
}

// TestGate: a table of scenarios, each a script of waiters arriving, Cuts failing,
// Lands answered and time passing, checked after each step: a waiter is released only
// once the shipment cut after it and every one before it have landed; waiters that arrive
// between two cuts share the next one; up to depth shipments land at once; nothing is cut
// without a waiter; a failed Cut is retried while waiters remain, a failed Land until it
// lands; a deadline fails a waiter with ErrNotDurable; a fence fails every waiter at once
// and ends shipping.
func TestGate(t *testing.T) {
	fenced := fmt.Errorf("putting segment 7: %w", ErrFenced)
	for _, tc := range []struct {
		name  string
		depth int
		ops   []gateOp
		errIs []error // every failed Wait's error matches each
	}{
		{name: "no waiter, no cut", ops: []gateOp{
			{sleep: time.Hour},
		}},
		{name: "depth 1: a shipment in flight does not release a later waiter", depth: 1, ops: []gateOp{
			{arrive: 1, cuts: 1, ids: 1, lands: 1},
			{arrive: 1, cuts: 1, ids: 1, lands: 1},
			{answer: 1, cuts: 2, ids: 2, lands: 2, ok: 1}, // the first is out; the second needs its own
			{answer: 2, cuts: 2, ids: 2, lands: 2, ok: 2},
			{sleep: time.Hour, cuts: 2, ids: 2, lands: 2, ok: 2},
		}},
		{name: "64 waiters during a shipment share the next one", depth: 1, ops: []gateOp{
			{arrive: 1, cuts: 1, ids: 1, lands: 1},
			{arrive: 64, cuts: 1, ids: 1, lands: 1},
			{answer: 1, cuts: 2, ids: 2, lands: 2, ok: 1},
			{answer: 2, cuts: 2, ids: 2, lands: 2, ok: 65},
		}},
		{name: "pipelined: a later waiter has its own cut at once and is released in order", depth: 4, ops: []gateOp{
			{arrive: 1, cuts: 1, ids: 1, lands: 1},
			{arrive: 1, cuts: 2, ids: 2, lands: 2},
			{answer: 2, cuts: 2, ids: 2, lands: 2}, // 2 landed, 1 not: nobody is out
			{answer: 1, cuts: 2, ids: 2, lands: 2, ok: 2},
		}},
		{name: "depth bounds the shipments in flight", depth: 2, ops: []gateOp{
			{arrive: 1, cuts: 1, ids: 1, lands: 1},
			{arrive: 1, cuts: 2, ids: 2, lands: 2},
			{arrive: 3, cuts: 2, ids: 2, lands: 2},
			{answer: 1, cuts: 3, ids: 3, lands: 3, ok: 1}, // a slot: the three share cut 3
			{answer: 3, cuts: 3, ids: 3, lands: 3, ok: 1},
			{answer: 2, cuts: 3, ids: 3, lands: 3, ok: 5},
		}},
		{name: "a failed landing is retried alone; the later ones wait for it", depth: 4, ops: []gateOp{
			{arrive: 1, cuts: 1, ids: 1, lands: 1},
			{arrive: 1, cuts: 2, ids: 2, lands: 2},
			{answer: 1, result: errFlaky, cuts: 2, ids: 2, lands: 3}, // the first retry is at once
			{answer: 2, cuts: 2, ids: 2, lands: 3},
			{answer: 1, result: errFlaky, cuts: 2, ids: 2, lands: 3}, // the next waits shipBackoff.First
			{sleep: shipBackoff.First - time.Millisecond, cuts: 2, ids: 2, lands: 3},
			{sleep: time.Millisecond, cuts: 2, ids: 2, lands: 4},
			{answer: 1, cuts: 2, ids: 2, lands: 4, ok: 2},
		}},
		{name: "a failed cut is retried while waiters remain, and covers those that arrived meanwhile", depth: 1, ops: []gateOp{
			{cutErrs: []error{errFlaky, errFlaky}, arrive: 1, cuts: 2}, // the first retry is at once
			{arrive: 1, cuts: 2},
			{sleep: shipBackoff.First, cuts: 3, ids: 1, lands: 1},
			{answer: 1, cuts: 3, ids: 1, lands: 1, ok: 2},
		}},
		{name: "a waiter past its deadline is not durable; its landing goes on", depth: 1, ops: []gateOp{
			{arrive: 1, deadline: 10 * time.Second, cuts: 1, ids: 1, lands: 1},
			{answer: 1, result: errFlaky, cuts: 1, ids: 1, lands: 2},
			{sleep: 10 * time.Second, cuts: 1, ids: 1, lands: 2, failed: 1},
			{answer: 1, result: errFlaky, cuts: 1, ids: 1, lands: 2, failed: 1},
			{sleep: shipBackoff.First, cuts: 1, ids: 1, lands: 3, failed: 1}, // retried with no waiter
			{answer: 1, cuts: 1, ids: 1, lands: 3, failed: 1},
			{sleep: time.Hour, cuts: 1, ids: 1, lands: 3, failed: 1},
		}, errIs: []error{ErrNotDurable, context.DeadlineExceeded, errFlaky}},
		{name: "a fenced landing fails every waiter at once and nothing ships again", depth: 4, ops: []gateOp{
			{arrive: 1, cuts: 1, ids: 1, lands: 1},
			{arrive: 5, cuts: 4, ids: 4, lands: 4}, // one cut each up to depth
			{answer: 1, result: fenced, cuts: 4, ids: 4, lands: 4, failed: 6},
			{arrive: 2, cuts: 4, ids: 4, lands: 4, failed: 8},
			{sleep: time.Hour, cuts: 4, ids: 4, lands: 4, failed: 8},
		}, errIs: []error{ErrNotDurable, ErrFenced}},
		{name: "a fenced cut fails every waiter at once", ops: []gateOp{
			{cutErrs: []error{fenced}, arrive: 3, cuts: 1, failed: 3},
			{sleep: time.Hour, cuts: 1, failed: 3},
		}, errIs: []error{ErrNotDurable, ErrFenced}},
		{name: "nothing new is durable at once", ops: []gateOp{
			{empty: true, arrive: 3, cuts: 3, ok: 3},
		}},
		{name: "nothing new still waits for the shipments before it", depth: 4, ops: []gateOp{
			{arrive: 1, cuts: 1, ids: 1, lands: 1},
			{empty: true, arrive: 1, cuts: 2, ids: 1, lands: 1},
			{answer: 1, cuts: 2, ids: 1, lands: 1, ok: 2},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				log := newFakeLog()
				g := New(log.config(tc.depth))
				defer g.Close(nil)
				var ws waiters
				var cancels []context.CancelFunc
				defer func() {
					for _, c := range cancels {
						c()
					}
				}()
				for i, op := range tc.ops {
					log.mu.Lock()
					log.cutErrs = append(log.cutErrs, op.cutErrs...)
					log.empty = log.empty || op.empty
					log.mu.Unlock()
					for range op.arrive {
						ctx, cancel := context.Background(), context.CancelFunc(func() {})
						if op.deadline > 0 {
							ctx, cancel = context.WithTimeout(ctx, op.deadline)
						}
						cancels = append(cancels, cancel)
						ws.start(g, ctx)
						synctest.Wait() // each arrives in turn
					}
					if op.answer > 0 {
						log.answerID(op.answer, op.result)
					}
					if op.sleep > 0 {
						time.Sleep(op.sleep)
					}
					synctest.Wait()
					ok, failed, _ := ws.counts()
					cuts, ids, lands := log.counts()
					if cuts != op.cuts || ids != op.ids || lands != op.lands || ok != op.ok || failed != op.failed {
						t.Fatalf("step %d %+v: cuts %d, shipments %d, lands %d, released %d, failed %d", i, op, cuts, ids, lands, ok, failed)
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

// TestEvery: with Every, a shipment is cut that often with no waiter (what the instance
// committed on its own lands), a Cut that finds nothing costs no Land, and Close ends it.
func TestEvery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newFakeLog()
		cfg := log.config(1)
		cfg.Every = time.Second
		g := New(cfg)
		time.Sleep(time.Second - time.Millisecond)
		synctest.Wait()
		if cuts, _, _ := log.counts(); cuts != 0 {
			t.Fatalf("cuts before Every: %d", cuts)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if cuts, ids, lands := log.counts(); cuts != 1 || ids != 1 || lands != 1 {
			t.Fatalf("after Every: cuts %d, shipments %d, lands %d", cuts, ids, lands)
		}
		log.answer(nil)
		log.mu.Lock()
		log.empty = true
		log.mu.Unlock()
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if cuts, ids, lands := log.counts(); cuts != 4 || ids != 1 || lands != 1 {
			t.Fatalf("three more seconds of nothing new: cuts %d, shipments %d, lands %d", cuts, ids, lands)
		}
		g.Close(nil)
		time.Sleep(time.Hour)
		synctest.Wait()
		if cuts, _, _ := log.counts(); cuts != 4 {
			t.Fatalf("cuts after Close: %d", cuts)
		}
	})
}

// TestPacing: with a shipment landing, the next cut waits a depth-th of the time recent
// shipments took to land, so the waiters that arrive meanwhile share one slot rather than
// each taking one at once.
func TestPacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newFakeLog()
		g := New(log.config(4))
		defer g.Close(nil)
		var ws waiters
		step := checkStep(t, log, &ws)
		ws.start(g, context.Background())
		step("the first waiter", 1, 0)
		time.Sleep(20 * time.Millisecond) // shipments take 20ms to land
		log.answer(nil)
		step("landed after 20ms", 1, 1)
		ws.start(g, context.Background())
		step("nothing in flight: a cut at once", 2, 1)
		ws.start(g, context.Background())
		step("one in flight: the next cut waits 20ms/4", 2, 1)
		time.Sleep(4 * time.Millisecond)
		ws.start(g, context.Background())
		step("4ms later, another waiter", 2, 1)
		time.Sleep(time.Millisecond)
		step("5ms after the last cut", 3, 1)
		log.answerID(2, nil)
		log.answerID(3, nil)
		step("both landed", 3, 4)
	})
}

// checkStep returns a check of a synctest scenario: once every goroutine is blocked, the
// log has seen wantCuts Cuts and ws has had wantOK waiters released.
func checkStep(t *testing.T, log *fakeLog, ws *waiters) func(what string, wantCuts, wantOK int) {
	return func(what string, wantCuts, wantOK int) {
		t.Helper()
		synctest.Wait()
		ok, _, _ := ws.counts()
		if cuts, _, _ := log.counts(); cuts != wantCuts || ok != wantOK {
			t.Fatalf("%s: cuts %d, released %d; want %d, %d", what, cuts, ok, wantCuts, wantOK)
		}
	}
}

// TestPipelineOver: with PipelineOver, a store whose landings are fast gets one shipment
// at a time (the waiters that arrive meanwhile share the next), until the one in flight has
// taken PipelineOver: a stuck landing does not hold the shipments after it. Once the
// landings take longer than PipelineOver, shipments land up to Depth at once.
func TestPipelineOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newFakeLog()
		cfg := log.config(4)
		cfg.PipelineOver = 10 * time.Millisecond
		g := New(cfg)
		defer g.Close(nil)
		var ws waiters
		step := checkStep(t, log, &ws)
		ws.start(g, context.Background())
		step("the first waiter", 1, 0)
		time.Sleep(2 * time.Millisecond)
		log.answer(nil)
		step("landed after 2ms", 1, 1)
		ws.start(g, context.Background())
		step("nothing in flight: a cut at once", 2, 1)
		ws.start(g, context.Background())
		ws.start(g, context.Background())
		time.Sleep(9 * time.Millisecond)
		step("a fast store: no second shipment while one lands", 2, 1)
		time.Sleep(time.Millisecond)
		step("landing for 10ms counts as slow: the next lands beside it", 3, 1)
		log.answerID(3, nil)
		step("landed past a gap: nothing released", 3, 1)
		log.answerID(2, nil) // 10ms: the average stays under 10ms
		step("the gap landed: all released", 3, 4)
		ws.start(g, context.Background())
		step("nothing in flight: a cut at once", 4, 4)
		ws.start(g, context.Background())
		time.Sleep(5 * time.Millisecond)
		log.answer(nil) // 5ms
		step("fast again: the waiter behind shares the next cut", 5, 5)
		time.Sleep(100 * time.Millisecond)
		log.answer(nil) // 100ms: the average is now over 10ms
		step("a slow landing", 5, 6)
		ws.start(g, context.Background())
		step("nothing in flight: a cut at once", 6, 6)
		ws.start(g, context.Background())
		time.Sleep(5 * time.Millisecond) // past the pace, a quarter of the average
		step("a slow store: the next shipment lands beside it", 7, 6)
		log.answerID(6, nil)
		log.answerID(7, nil)
		step("both landed", 7, 8)
	})
}

// TestClose: Close fails the waiters held and every later one with ErrClosed (or its
// error), ends the Lands in flight through their ctx, and returns once none runs.
func TestClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newFakeLog()
		g := New(log.config(4))
		var ws waiters
		for range 3 {
			ws.start(g, context.Background())
			synctest.Wait()
		}
		g.Close(nil)
		synctest.Wait()
		if ok, failed, errs := ws.counts(); ok != 0 || failed != 3 || !errors.Is(errs[0], ErrNotDurable) || !errors.Is(errs[0], ErrClosed) {
			t.Fatalf("after Close: released %d, failed %d %v", ok, failed, errs)
		}
		if err := g.Wait(context.Background()); !errors.Is(err, ErrClosed) {
			t.Fatalf("Wait after Close = %v", err)
		}
		g.Close(errors.New("second")) // idempotent: the first error stands
		if s := g.Stats(); s.Ships != 0 || !errors.Is(s.Closed, ErrClosed) {
			t.Fatalf("stats %+v", s)
		}
		if cuts, ids, lands := log.counts(); cuts != 3 || ids != 3 || lands != 3 {
			t.Fatalf("cuts %d, shipments %d, lands %d", cuts, ids, lands)
		}
	})
}

// TestPanicsAreRetried: a panic in Cut or Land is a failure, retried; the gate lives on.
func TestPanicsAreRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cuts, lands atomic.Int64
		g := New(Config{Cut: func(context.Context) (Land, error) {
			if cuts.Add(1) == 1 {
				panic("bad log")
			}
			return func(context.Context) error {
				if lands.Add(1) == 1 {
					panic("bad segment")
				}
				return nil
			}, nil
		}})
		defer g.Close(nil)
		if err := g.Wait(context.Background()); err != nil {
			t.Fatalf("Wait = %v", err)
		}
		if s := g.Stats(); s.Ships != 1 || s.ShipErrors != 2 || cuts.Load() != 2 || lands.Load() != 2 {
			t.Fatalf("stats %+v, cuts %d, lands %d", s, cuts.Load(), lands.Load())
		}
	})
}

// TestStats: the durable lag is the oldest held waiter's age (0 with none), and the wait
// percentiles are how long waiters were held.
func TestStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := newFakeLog()
		g := New(log.config(1))
		defer g.Close(nil)
		var ws waiters
		ws.start(g, context.Background()) // held 30ms: shipment 1
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		ws.start(g, context.Background()) // held 20ms + 40ms: shipment 2
		time.Sleep(20 * time.Millisecond)
		synctest.Wait()
		if s := g.Stats(); s.Lag != 30*time.Millisecond || s.Waiting != 2 || s.Landing != 1 {
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
		// Shipment 1 took 30ms from its cut to landed, shipment 2 40ms: 30 + (40-30)/8.
		want := Stats{Waits: 2, WaitP50: 30 * time.Millisecond, WaitP99: 60 * time.Millisecond, Ships: 2, ShipErrors: 1, LandTime: 31250 * time.Microsecond}
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

// BenchmarkGateWait: the cost of a Wait with an instant shipment, one waiter at a time
// and 64 at once, and 64 at once over a Land that takes 1ms or 20ms (a bucket PUT, near and
// far) one at a time and pipelined, where ships/op shows the group commit.
func BenchmarkGateWait(b *testing.B) {
	for _, bc := range []struct {
		land     time.Duration
		depth    int
		parallel int
	}{{0, 1, 1}, {0, 1, 64}, {time.Millisecond, 1, 64}, {20 * time.Millisecond, 1, 64}, {20 * time.Millisecond, DefaultDepth, 64}, {20 * time.Millisecond, 8, 64}} {
		b.Run(fmt.Sprintf("land=%v/depth=%d/waiters=%d", bc.land, bc.depth, bc.parallel), func(b *testing.B) {
			var ships atomic.Int64
			g := New(Config{Depth: bc.depth, Cut: func(context.Context) (Land, error) {
				ships.Add(1)
				return func(context.Context) error {
					if bc.land > 0 {
						time.Sleep(bc.land) // the bucket's latency, not a wait on a condition
					}
					return nil
				}, nil
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
