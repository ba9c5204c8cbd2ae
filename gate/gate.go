// Package gate holds an instance's answers until the commits they may reveal are durable:
// the output gate of Durable Objects and of celld's bucket proofs, for a kind whose
// durability is "bucket". A Gate groups the waits of many answers into one shipment of the
// space's log (group commit) and keeps several shipments landing at once (a pipeline), each
// released only once every shipment before it has landed too; a Writer stands between the
// reverse proxy and the client and waits on the Gate before it passes each part of an
// instance's answer on, so no client sees an answer (a 201, an error, a streamed chunk)
// before every commit the instance made ahead of it is in the bucket.
package gate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/backoff"
	"github.com/lchat/lchat-caddy/internal/safego"
)

// shipBackoff spaces the retries of a failed Cut or Land: the first retry at once (a
// dropped connection, one 500 from the bucket), then 20ms doubling to 1s, so a waiter with
// the engine's 10s deadline sees about fifteen tries and a sick bucket is not hammered.
var shipBackoff = backoff.Curve{First: 20 * time.Millisecond, Max: time.Second, Free: 1}

// DefaultDepth is how many shipments land at once unless Config.Depth says otherwise.
const DefaultDepth = 4

var (
	// ErrNotDurable is matched (errors.Is) by every error Wait returns: the commits the
	// answer may reveal are not known to be durable, and the answer must not reach the
	// client. It wraps the cause: the waiter's ctx error and the last Cut's or Land's
	// error, or the error the gate was closed with.
	ErrNotDurable = errors.New("not durable")
	// ErrFenced is the sentinel a Cut or Land marks a permanent failure with (wrapped,
	// matched with errors.Is): a takeover sealed the log, so no later shipment can land.
	// The gate fails every current and future waiter with that error and closes; it calls
	// Cut and Land no more.
	ErrFenced = errors.New("log fenced")
	// ErrClosed is why a gate closed by Close(nil) fails its waiters.
	ErrClosed = errors.New("gate closed")
)

// Land lands one shipment and returns nil once it is durable in the bucket. After an error
// that does not wrap ErrFenced the gate calls it again (shipBackoff), whether or not
// anyone still waits, until it lands or the gate closes: a shipment that never lands holds
// back the release of every later one.
type Land func(ctx context.Context) error

// Config configures a Gate.
type Config struct {
	// Cut takes everything the instance committed so far into the next shipment and
	// returns how to land it: nil when nothing was committed since the last Cut (the
	// shipment is durable at once). The gate calls Cut one at a time, in shipment order,
	// with a ctx that ends at Close; the shipments it returns may land in any order and at
	// once (up to Depth). An error that wraps ErrFenced is permanent; any other is retried
	// (shipBackoff) while waiters remain. Neither Cut nor a Land may call the gate's Close.
	// Required.
	Cut func(ctx context.Context) (Land, error)
	// Depth is how many shipments may be landing at once (0: DefaultDepth): a waiter that
	// arrives while shipments are in flight has its own cut at once, up to Depth, rather
	// than wait for them to land. 1 ships one at a time.
	Depth int
	// PipelineOver, when positive, keeps one shipment landing at a time while recent
	// landings (a moving average, from cut to landed) took less than it and the one in
	// flight has not yet taken longer; up to Depth otherwise. On a fast store the writes
	// that arrive while one lands then share the next shipment, each carrying more of them:
	// fewer requests, and less CPU on the box and the store, for a wait about as long. On a
	// slow one the pipeline keeps a write's wait near one landing rather than two, and a
	// landing stuck on a fast one (a lost answer, a retry) does not hold the shipments
	// after it.
	PipelineOver time.Duration
	// Every, when positive, cuts a shipment at least this often with no waiter (what the
	// instance commits without answering anyone is then durable within Every). The gate's
	// goroutine then runs from New to Close.
	Every time.Duration
	// Now is the clock of Stats (wait durations, the durable lag). Default time.Now. The
	// retry waits use the runtime's timers: a test drives both with testing/synctest.
	Now func() time.Time
	// Logger logs a panic in Cut or Land. Default zap.L().
	Logger *zap.Logger
}

// Gate holds waiters until the shipment cut after each of them, and every shipment before
// it, has landed. Waiters that arrive between two cuts share the next one; with no waiter
// (and no Every) nothing is cut. A Gate is safe for concurrent use.
type Gate struct {
	cut    func(context.Context) (Land, error)
	depth  int
	over   time.Duration // Config.PipelineOver
	every  time.Duration
	now    func() time.Time
	logger *zap.Logger
	ctx    context.Context // ends at Close or a fence: every Cut's and Land's
	cancel context.CancelFunc
	wg     sync.WaitGroup // the cut loop and the landings
	kick   chan struct{}  // wakes the cut loop: a waiter arrived, a landing ended (buffered 1)

	mu sync.Mutex
	// Written under mu by Wait (a waiter arriving or leaving), the cut loop (a Cut's
	// outcome), the landings and Close; the cut loop is the only caller of Cut.
	closed     error         // why the gate is closed; nil while open
	running    bool          // the cut loop runs: started by a waiter (or New, with every)
	started    uint64        // shipments cut; a waiter arriving now needs shipment started+1
	durable    uint64        // every shipment up to this one has landed
	flight     []flight      // flight[i]: shipment durable+1+i, cut and perhaps landed
	landing    int           // shipments cut and not landed
	rounds     []*round      // unreleased rounds, by target
	head, tail *waiter       // the waiters not yet released, in arrival order
	waiting    int           // how many
	lastErr    error         // the last Cut's or Land's error; nil after a success
	lastCut    time.Time     // when the last cut started (the runtime's clock)
	landTime   time.Duration // how long recent shipments took from cut to landed (a moving average)
	stats      counters
}

// flight is a shipment past the durable point: when it was cut, and whether it has landed
// (shipments land out of order).
type flight struct {
	at     time.Time // its cut started (the runtime's clock)
	landed bool
}

// round is the waiters that arrived between two cuts: they share a release.
type round struct {
	target uint64        // the shipment that covers them: cut after they arrived
	done   chan struct{} // closed at the release
	err    error         // nil: durable; else why not. Set before done closes.
}

// waiter is one Wait in the gate's queue.
type waiter struct {
	r          *round
	since      time.Time
	prev, next *waiter
	queued     bool // still in the queue: neither released nor gone
}

// New is a Gate over cfg.Cut. No goroutine runs until the first Wait, unless cfg.Every is
// set.
func New(cfg Config) *Gate {
	if cfg.Cut == nil {
		panic("gate: Config.Cut is nil")
	}
	g := &Gate{cut: cfg.Cut, depth: cfg.Depth, over: cfg.PipelineOver, every: cfg.Every, now: cfg.Now, logger: cfg.Logger, kick: make(chan struct{}, 1)}
	if g.depth <= 0 {
		g.depth = DefaultDepth
	}
	if g.now == nil {
		g.now = time.Now
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	if g.every > 0 {
		g.running = true
		safego.Go(&g.wg, g.logger, "gate cut loop", g.run)
	}
	return g
}

// Wait returns nil once the shipment cut after Wait was called, and every one before it,
// has landed, so every commit made before the call is durable. A shipment cut before the
// call does not count: it may have read the log before the commit. Errors, all matching
// ErrNotDurable:
//   - ctx ended first: the error wraps ctx.Err() and the last Cut's or Land's error, if it
//     failed. The commits may still become durable later (the shipments in flight keep
//     landing); the caller must answer as if they had not.
//   - the gate is closed, now or while waiting: the error wraps the error it was closed
//     with (ErrFenced from a Cut or Land, ErrClosed, or Close's argument). Nothing ships
//     again.
func (g *Gate) Wait(ctx context.Context) error { return g.WaitFor(ctx, 0) }

// WaitFor is Wait bounded by d too (none when d <= 0): once d passes first, the error
// wraps context.DeadlineExceeded, as a ctx with that timeout would.
func (g *Gate) WaitFor(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		g.mu.Lock()
		g.stats.noWait()
		g.mu.Unlock()
		return fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	g.mu.Lock()
	if g.closed != nil {
		err := g.closed
		g.stats.noWait()
		g.mu.Unlock()
		return fmt.Errorf("%w: %w", ErrNotDurable, err)
	}
	w := g.enqueueLocked()
	if !g.running {
		g.running = true
		safego.Go(&g.wg, g.logger, "gate cut loop", g.run)
	} else {
		g.kickLocked()
	}
	g.mu.Unlock()

	// A timer of its own, not a ctx with a timeout: an answer's wait is the gate's hot
	// path, and the ctx would cost it a context and a registration with the request's too.
	var expired <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		expired = t.C
	}
	var cause error
	select {
	case <-w.r.done:
		return w.r.result()
	case <-ctx.Done():
		cause = ctx.Err()
	case <-expired:
		cause = context.DeadlineExceeded
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !w.queued { // released while the wait ended: the release stands
		return w.r.result()
	}
	g.unlinkLocked(w)
	g.stats.waited(g.now().Sub(w.since), false)
	if g.lastErr != nil {
		return fmt.Errorf("%w: %w; last ship: %w", ErrNotDurable, cause, g.lastErr)
	}
	return fmt.Errorf("%w: %w", ErrNotDurable, cause)
}

// Close closes the gate for the engine's stop: every current and future waiter fails
// with ErrNotDurable wrapping err (ErrClosed if nil), the ctx of every Cut and Land in
// flight ends, and Close returns once the cut loop and the landings have: none runs after
// it. Idempotent: the first error stands.
func (g *Gate) Close(err error) {
	if err == nil {
		err = ErrClosed
	}
	g.mu.Lock()
	if g.closed == nil {
		g.closeLocked(err)
	}
	g.mu.Unlock()
	g.wg.Wait()
}

func (r *round) result() error {
	if r.err != nil {
		return fmt.Errorf("%w: %w", ErrNotDurable, r.err)
	}
	return nil
}

// enqueueLocked queues a waiter in the round that the next shipment to be cut covers.
func (g *Gate) enqueueLocked() *waiter {
	target := g.started + 1
	var r *round
	if n := len(g.rounds); n > 0 && g.rounds[n-1].target == target {
		r = g.rounds[n-1]
	} else {
		r = &round{target: target, done: make(chan struct{})}
		g.rounds = append(g.rounds, r)
	}
	w := &waiter{r: r, since: g.now(), prev: g.tail, queued: true}
	if g.tail != nil {
		g.tail.next = w
	} else {
		g.head = w
	}
	g.tail = w
	g.waiting++
	return w
}

func (g *Gate) unlinkLocked(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		g.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		g.tail = w.prev
	}
	w.prev, w.next, w.queued = nil, nil, false
	g.waiting--
}

func (g *Gate) kickLocked() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// uncoveredLocked reports whether a waiter still queued needs a shipment not yet cut.
func (g *Gate) uncoveredLocked() bool {
	return g.tail != nil && g.tail.r.target > g.started
}

// run is the cut loop, the one caller of Cut: it cuts a shipment whenever a waiter needs
// one and fewer than depth are landing (or Every passed), retrying a failed Cut by
// shipBackoff, and ends when no waiter needs a cut (without Every) or the gate closes.
func (g *Gate) run() {
	failures := 0
	var tick <-chan time.Time
	var timer *time.Timer
	if g.every > 0 {
		timer = time.NewTimer(g.every)
		defer timer.Stop()
		tick = timer.C
	}
	for {
		g.mu.Lock()
		if g.closed != nil {
			g.running = false
			g.mu.Unlock()
			return
		}
		need := g.uncoveredLocked()
		if !need && g.every <= 0 {
			g.running = false
			if g.waiting == 0 {
				g.rounds = nil // rounds whose waiters all left
			}
			g.mu.Unlock()
			return
		}
		pace, depth := g.paceLocked(), g.depthLocked()
		if !need || g.landing >= depth || pace > 0 {
			// Wake for the pace, or, with cuts held to one landing at a time, when
			// that one has taken long enough to count as slow.
			wake := pace
			if g.landing >= depth && depth < g.depth {
				wake = g.stuckInLocked()
			}
			g.mu.Unlock()
			var paced <-chan time.Time
			var pacer *time.Timer
			if need && wake > 0 {
				pacer = time.NewTimer(wake)
				paced = pacer.C
			}
			stopPacer := func() {
				if pacer != nil {
					pacer.Stop()
				}
			}
			select {
			case <-g.kick:
				stopPacer()
				continue
			case <-g.ctx.Done():
				continue
			case <-paced:
				continue
			case <-tick:
				stopPacer()
				timer.Reset(g.every)
				g.mu.Lock()
				if g.closed != nil || g.landing >= g.depthLocked() {
					g.mu.Unlock()
					continue
				}
			}
		}
		g.started++
		n := g.started
		g.landing++
		at := time.Now()
		g.lastCut = at
		g.flightLocked(n).at = at
		g.mu.Unlock()
		if timer != nil {
			timer.Reset(g.every)
		}

		land, err := g.cutOnce()

		g.mu.Lock()
		switch {
		case g.closed != nil:
		case err == nil && land == nil: // nothing new since the last cut
			failures = 0
			g.lastErr = nil
			g.landedLocked(n)
		case err == nil:
			failures = 0
			safego.Go(&g.wg, g.logger, "gate landing", func() { g.landLoop(n, at, land) })
		case errors.Is(err, ErrFenced):
			g.stats.shipErrors++
			g.lastErr = err
			g.closeLocked(err)
		default:
			// Shipment n was not cut: the next cut takes its number, and covers the
			// waiters that arrived meanwhile too.
			g.stats.shipErrors++
			failures++
			g.lastErr = err
			g.landing--
			g.started--
			for i := len(g.rounds) - 1; i >= 0 && g.rounds[i].target > g.started+1; i-- {
				g.rounds[i].target = g.started + 1
			}
		}
		g.mu.Unlock()

		if d := shipBackoff.After(failures); err != nil && d > 0 {
			g.sleep(d)
		}
	}
}

// paceLocked is how long the next cut should wait so that the shipments in flight are
// spread over the time one takes to land: with one landing, a cut waits landTime/depth
// after the last, so that the waiters that arrive meanwhile share it rather than each
// taking a slot at once and leaving the next ones to wait a whole landing. 0: cut now.
func (g *Gate) paceLocked() time.Duration {
	if g.landing == 0 || g.landTime == 0 {
		return 0
	}
	return max(0, g.landTime/time.Duration(g.depthLocked())-time.Since(g.lastCut))
}

// depthLocked is how many shipments may be landing at once now: 1 while the recent
// landings were faster than PipelineOver and the oldest in flight has not taken longer
// (stuckInLocked), else Depth.
func (g *Gate) depthLocked() int {
	if g.over > 0 && g.landTime > 0 && g.landTime < g.over && g.stuckInLocked() > 0 {
		return 1
	}
	return g.depth
}

// stuckInLocked is how long until the oldest shipment in flight has been landing for
// PipelineOver: then it counts as slow, and the shipments after it land beside it. 0: it
// already has, or none is in flight, or no PipelineOver.
func (g *Gate) stuckInLocked() time.Duration {
	if g.over <= 0 || g.landing == 0 || len(g.flight) == 0 {
		return 0
	}
	// The oldest in flight is durable+1: every one before it has landed, and it has been
	// cut, as landing > 0 says.
	return max(0, g.over-time.Since(g.flight[0].at))
}

// landLoop lands shipment n, cut at at, retrying by shipBackoff until it lands or the
// gate closes.
func (g *Gate) landLoop(n uint64, at time.Time, land Land) {
	for failures := 0; ; {
		err := g.landOnce(land)
		g.mu.Lock()
		switch {
		case g.closed != nil:
			g.mu.Unlock()
			return
		case err == nil:
			g.lastErr = nil
			if d := time.Since(at); g.landTime == 0 {
				g.landTime = d
			} else {
				g.landTime += (d - g.landTime) / 8
			}
			g.landedLocked(n)
			g.kickLocked()
			g.mu.Unlock()
			return
		case errors.Is(err, ErrFenced):
			g.stats.shipErrors++
			g.lastErr = err
			g.closeLocked(err)
			g.mu.Unlock()
			return
		}
		g.stats.shipErrors++
		failures++
		g.lastErr = err
		g.mu.Unlock()
		if d := shipBackoff.After(failures); d > 0 {
			g.sleep(d)
		}
	}
}

// sleep waits d, or less if the gate closes.
func (g *Gate) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-g.ctx.Done():
	}
}

// cutOnce calls Cut, turning a panic in it into an error (a retried one).
func (g *Gate) cutOnce() (land Land, err error) {
	if p := safego.Run(g.logger, "gate cut", func() { land, err = g.cut(g.ctx) }); p != nil {
		return nil, fmt.Errorf("cutting a shipment: panic: %v", p)
	}
	return land, err
}

// landOnce calls land, turning a panic in it into an error (a retried one).
func (g *Gate) landOnce(land Land) (err error) {
	if p := safego.Run(g.logger, "gate land", func() { err = land(g.ctx) }); p != nil {
		return fmt.Errorf("landing a shipment: panic: %v", p)
	}
	return err
}

// flightLocked is shipment n's entry, n past the durable point.
func (g *Gate) flightLocked(n uint64) *flight {
	i := int(n - g.durable - 1)
	for len(g.flight) <= i {
		g.flight = append(g.flight, flight{})
	}
	return &g.flight[i]
}

// landedLocked records that shipment n has landed and releases every waiter that the
// shipments landed without a gap before them now cover.
func (g *Gate) landedLocked(n uint64) {
	g.landing--
	g.stats.ships++
	g.flightLocked(n).landed = true
	k := 0
	for k < len(g.flight) && g.flight[k].landed {
		k++
	}
	if k == 0 {
		return
	}
	g.durable += uint64(k)
	g.flight = append(g.flight[:0], g.flight[k:]...)
	g.releaseLocked(g.durable)
}

// releaseLocked releases every waiter that shipment n covers: those that arrived before
// it was cut.
func (g *Gate) releaseLocked(n uint64) {
	now := g.now()
	for g.head != nil && g.head.r.target <= n {
		w := g.head
		g.unlinkLocked(w)
		g.stats.waited(now.Sub(w.since), true)
	}
	i := 0
	for ; i < len(g.rounds) && g.rounds[i].target <= n; i++ {
		close(g.rounds[i].done)
	}
	g.rounds = append(g.rounds[:0], g.rounds[i:]...)
}

// closeLocked is the one close path (Close, a fenced Cut or Land): every waiter fails
// with err.
func (g *Gate) closeLocked(err error) {
	g.closed = err
	now := g.now()
	for g.head != nil {
		w := g.head
		g.unlinkLocked(w)
		g.stats.waited(now.Sub(w.since), false)
	}
	for _, r := range g.rounds {
		r.err = err
		close(r.done)
	}
	g.rounds = nil
	g.cancel()
}
