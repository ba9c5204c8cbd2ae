package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// Acquire wakes the space if needed (all concurrent callers share one wake), marks it in use
// and returns a Use.
func (e *Engine) Acquire(ctx context.Context, sp Space) (*Use, error) {
	kind, ok := e.kind(sp.Kind)
	if !ok {
		return nil, ErrUnknownKind
	}
	if !validHost(sp.Host) {
		return nil, fmt.Errorf("invalid host %q", sp.Host)
	}
	return e.acquire(ctx, sp, kind, e.get(sp.Host))
}

// acquire is Acquire's loop, starting from in (the host's inst when Acquire looked).
func (e *Engine) acquire(ctx context.Context, sp Space, kind Kind, in *inst) (*Use, error) {
	// waiting is true while this caller still counts in in.waiters after a transition
	// ended: it stops counting in the same critical section that takes the Use, so a
	// space just woken for it is never idle (uses and waiters both 0) in between, where
	// the awake cap could pick it as the space to sleep.
	waiting := false
	defer func() {
		if waiting {
			in.mu.Lock()
			in.waiters--
			in.changedLocked()
			in.mu.Unlock()
		}
	}()
	for {
		if e.ctx.Err() != nil {
			return nil, &RetryError{After: 5 * time.Second, Reason: "box shutting down"}
		}
		if e.life.Fenced() || e.cfg.Fresh != nil && !e.cfg.Fresh() {
			return nil, &RetryError{After: 5 * time.Second, Reason: "box fenced: bucket heartbeat failing"}
		}
		in.mu.Lock()
		if waiting {
			in.waiters--
			in.changedLocked()
			waiting = false
		}
		switch in.state {
		case StateDropped:
			// Forgotten (removed, tombstoned) since this caller found it: waking it
			// would run a second instance beside the one a new inst for the host
			// wakes, on the same socket path. Wait for the drop to end (it holds op
			// until the inst is out of the map) and take the host's current inst.
			in.mu.Unlock()
			in.op.Lock()
			in.op.Unlock()
			in = e.get(sp.Host)
			continue
		case StateAwake:
			if in.draining {
				// Its drain waits for the Uses given out; a new one would be cut.
				in.mu.Unlock()
				return nil, ErrDraining
			}
			in.uses++
			in.lastUsed = e.now()
			u := &Use{in: in, gen: in.gen, socket: in.link, since: in.since}
			if in.proc != nil {
				u.pid = in.proc.pid
			}
			in.mu.Unlock()
			return u, nil
		case StateWaking, StateSleeping:
			t := in.trans
			waking := in.state == StateWaking
			in.waiters++
			in.mu.Unlock()
			err := in.wait(ctx, t)
			waiting = err == nil
			if err != nil {
				return nil, err
			}
			if waking && t.err != nil {
				return nil, t.err
			}
		case StateHeld, StateRechecking:
			// Stopped while this box was fenced: the lease and manifest are re-read
			// (one recheck at a time) before the space is served again.
			if in.state == StateHeld && in.setStateLocked(StateRechecking) == nil {
				held := in // in changes when a dropped inst is replaced
				safego.Go(&e.wg, e.log, "recheck", func() { e.recheck(held) })
			}
			in.mu.Unlock()
			return nil, &RetryError{After: time.Second, Reason: "re-checking lease after fence"}
		default: // asleep, failed, fenced, unsaved
			if e.life.Draining() {
				// A draining box serves its awake spaces until the drain puts them to
				// sleep, and wakes none.
				in.mu.Unlock()
				return nil, ErrDraining
			}
			if wait, why := in.retryWaitLocked(); wait > 0 {
				in.mu.Unlock()
				return nil, &RetryError{After: ceilSecond(wait), Reason: why}
			}
			in.sp, in.kind = sp, kind
			if err := in.setStateLocked(StateWaking); err != nil {
				in.mu.Unlock()
				return nil, err
			}
			t := in.trans
			t.ticket = e.wakeSeq.Add(1)
			e.gate.begin(t.ticket)
			in.waiters++
			in.mu.Unlock()
			waker := in // in changes when a dropped inst is replaced
			safego.Go(&e.wg, e.log, "wake", func() { e.runWake(waker, t) })
			err := in.wait(ctx, t)
			waiting = err == nil
			if err != nil {
				return nil, err
			}
			if t.err != nil {
				return nil, t.err
			}
		}
	}
}

// wait blocks until t is done or ctx ends. When ctx ends it drops this caller from the
// waiters; when t is done the caller still counts and drops itself (Acquire).
func (in *inst) wait(ctx context.Context, t *transition) error {
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		in.mu.Lock()
		in.waiters--
		in.changedLocked()
		in.mu.Unlock()
		return ctx.Err()
	}
}
