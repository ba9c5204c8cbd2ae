// Package gate holds an instance's answers until the commits they may reveal are durable:
// the output gate of Durable Objects and of celld's bucket proofs, for a kind whose
// durability is "bucket". A Gate groups the waits of many answers into one Ship of the
// space's log (group commit); a Writer stands between the reverse proxy and the client and
// waits on the Gate before it passes each part of an instance's answer on, so no client
// sees an answer (a 201, an error, a streamed chunk) before every commit the instance made
// ahead of it is in the bucket.
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

// shipBackoff spaces the retries of a failed Ship while waiters remain: the first retry at
// once (a dropped connection, one 500 from the bucket), then 20ms doubling to 1s, so a
// waiter with the engine's 10s deadline sees about fifteen tries and a sick bucket is not
// hammered.
var shipBackoff = backoff.Curve{First: 20 * time.Millisecond, Max: time.Second, Free: 1}

var (
	// ErrNotDurable is matched (errors.Is) by every error Wait returns: the commits the
	// answer may reveal are not known to be durable, and the answer must not reach the
	// client. It wraps the cause: the waiter's ctx error and the last Ship's error, or
	// the error the gate was closed with.
	ErrNotDurable = errors.New("not durable")
	// ErrFenced is the sentinel a Ship marks a permanent failure with (wrapped, matched
	// with errors.Is): a takeover sealed the log, so no later Ship can succeed. The gate
	// fails every current and future waiter with that error and closes; it calls Ship no
	// more.
	ErrFenced = errors.New("log fenced")
	// ErrClosed is why a gate closed by Close(nil) fails its waiters.
	ErrClosed = errors.New("gate closed")
)

// Config configures a Gate.
type Config struct {
	// Ship ships everything the instance committed so far and returns nil once it is
	// durable in the bucket. The gate calls it at most once at a time, with a ctx that
	// ends at Close. An error that wraps ErrFenced is permanent; any other is retried
	// (shipBackoff) while waiters remain. It must not call the gate's Close. Required.
	Ship func(ctx context.Context) error
	// Now is the clock of Stats (wait durations, the durable lag). Default time.Now. The
	// retry waits use the runtime's timers: a test drives both with testing/synctest.
	Now func() time.Time
	// Logger logs a panic in Ship. Default zap.L().
	Logger *zap.Logger
}

// Gate holds waiters until a Ship that started after each of them has succeeded. Waiters
// that arrive while a Ship is in flight share the next one; with no waiter nothing ships.
// A Gate is safe for concurrent use.
type Gate struct {
	ship   func(context.Context) error
	now    func() time.Time
	logger *zap.Logger
	ctx    context.Context // ends at Close or a fence: the ship loop's and each Ship's
	cancel context.CancelFunc
	wg     sync.WaitGroup // the ship loop

	mu sync.Mutex
	// Written under mu by Wait (a waiter arriving or leaving), the ship loop (a Ship's
	// outcome) and Close; the ship loop is the only caller of Ship.
	closed     error    // why the gate is closed; nil while open
	running    bool     // a ship loop runs: started by a waiter, it ends when none remain
	started    uint64   // Ships begun; a waiter arriving now needs Ship number started+1
	rounds     []*round // unreleased rounds, by target
	head, tail *waiter  // the waiters not yet released, in arrival order
	waiting    int      // how many
	lastErr    error    // the last Ship's error; nil after a success
	stats      counters
}

// round is the waiters that arrived between two Ship starts: they share a release.
type round struct {
	target uint64        // the first Ship number that covers them
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

// New is a Gate over cfg.Ship. No goroutine runs until the first Wait.
func New(cfg Config) *Gate {
	if cfg.Ship == nil {
		panic("gate: Config.Ship is nil")
	}
	g := &Gate{ship: cfg.Ship, now: cfg.Now, logger: cfg.Logger}
	if g.now == nil {
		g.now = time.Now
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	return g
}

// Wait returns nil once a Ship that started after Wait was called has succeeded, so every
// commit made before the call is durable. A Ship in flight at the call does not count: it
// may have read the log before the commit. Errors, all matching ErrNotDurable:
//   - ctx ended first: the error wraps ctx.Err() and the last Ship's error, if the last
//     Ship failed. The commits may still become durable later (the gate keeps shipping
//     while other waiters remain); the caller must answer as if they had not.
//   - the gate is closed, now or while waiting: the error wraps the error it was closed
//     with (a Ship's ErrFenced, ErrClosed, or Close's argument). Nothing ships again.
func (g *Gate) Wait(ctx context.Context) error {
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
		safego.Go(&g.wg, g.logger, "gate ship loop", g.run)
	}
	g.mu.Unlock()

	select {
	case <-w.r.done:
		return w.r.result()
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !w.queued { // released while ctx ended: the release stands
		return w.r.result()
	}
	g.unlinkLocked(w)
	g.stats.waited(g.now().Sub(w.since), false)
	if g.lastErr != nil {
		return fmt.Errorf("%w: %w; last ship: %w", ErrNotDurable, ctx.Err(), g.lastErr)
	}
	return fmt.Errorf("%w: %w", ErrNotDurable, ctx.Err())
}

// Close closes the gate for the engine's stop: every current and future waiter fails
// with ErrNotDurable wrapping err (ErrClosed if nil), the ctx of a Ship in flight ends,
// and Close returns once the ship loop has: no Ship runs after it. Idempotent: the
// first error stands.
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

// enqueueLocked queues a waiter in the round that the next Ship to start covers.
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

// run is the ship loop, the one caller of Ship: it ships while waiters remain, retrying
// a failure by shipBackoff, and ends when none remain or the gate closes.
func (g *Gate) run() {
	failures := 0
	for {
		g.mu.Lock()
		if g.closed != nil || g.waiting == 0 {
			g.running = false
			if g.closed == nil {
				g.rounds = nil // rounds whose waiters all left
			}
			g.mu.Unlock()
			return
		}
		g.started++
		n := g.started
		g.mu.Unlock()

		err := g.shipOnce()

		g.mu.Lock()
		g.stats.ships++
		if err != nil {
			g.stats.shipErrors++
		}
		if g.closed == nil {
			switch {
			case err == nil:
				failures = 0
				g.lastErr = nil
				g.releaseLocked(n)
			case errors.Is(err, ErrFenced):
				g.lastErr = err
				g.closeLocked(err)
			default:
				failures++
				g.lastErr = err
			}
		}
		g.mu.Unlock()

		if d := shipBackoff.After(failures); err != nil && d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-g.ctx.Done():
				t.Stop()
			}
		}
	}
}

// shipOnce calls Ship, turning a panic in it into an error (a retried one).
func (g *Gate) shipOnce() (err error) {
	if p := safego.Run(g.logger, "gate ship", func() { err = g.ship(g.ctx) }); p != nil {
		return fmt.Errorf("shipping: panic: %v", p)
	}
	return err
}

// releaseLocked releases every waiter that Ship number n covers: those that arrived
// before it started.
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

// closeLocked is the one close path (Close, a fenced Ship): every waiter fails with err.
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
