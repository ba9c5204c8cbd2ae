package engine

import (
	"errors"
	"time"

	"go.uber.org/zap"
)

// MaxAwake is a cap, not a wish. A space that is in use (a request in flight, an open
// stream or WebSocket: a Use not yet released) is never put to sleep to make room, since
// that would cut a client off mid-stream for another client's sake. So when every awake
// space is in use, the new wake is the one that gives: it is refused with a 503 and
// Retry-After (capRetryAfter), without touching the bucket, and the client retries once
// a space has gone idle and been slept. Otherwise the least recently used idle space
// sleeps first.
//
// The count is exact under concurrent wakes: a wake is admitted under capMu, and the
// spaces counted are the awake ones plus the waking ones already admitted.

// errAwakeCap marks the refusal of a wake at the awake cap (a RetryError wraps it).
var errAwakeCap = errors.New("awake cap reached and every awake space is in use")

// CapRefused reports whether err is a wake refused at the awake cap (max_awake, every
// awake space in use): the space is not awake anywhere on this box's account and nothing
// was written, so a box of a mesh may send the request to another box with room
// (mesh.Node.AtCap) instead of the refusal's 503.
func CapRefused(err error) bool { return errors.Is(err, errAwakeCap) }

// capRetryAfter is the Retry-After of a wake refused at the awake cap.
const capRetryAfter = 5 * time.Second

// capError is the refusal of a wake at the awake cap.
type capError struct{ RetryError }

func (e *capError) Unwrap() []error { return []error{&e.RetryError, errAwakeCap} }

func newCapError() error {
	return &capError{RetryError{After: capRetryAfter, Reason: "awake cap reached; every awake space is in use"}}
}

// countAwakeCapHeld counts the spaces other than self that hold a place under the cap,
// and picks the least recently used idle awake one. capMu is held.
func (e *Engine) countAwakeCapHeld(self *inst) (n int, victim *inst) {
	var victimUsed time.Time
	for _, in := range e.all() {
		if in == self {
			continue
		}
		in.mu.Lock()
		switch in.state {
		case StateAwake:
			n++
			if in.uses == 0 && in.waiters == 0 && (victim == nil || in.lastUsed.Before(victimUsed)) {
				victim, victimUsed = in, in.lastUsed
			}
		case StateWaking:
			if in.trans != nil && in.trans.admitted {
				n++
			}
		}
		in.mu.Unlock()
	}
	return n, victim
}

// checkRoom reports, without side effects, whether self could wake under the cap: there
// is room now, or an idle space could be slept for it. It runs before the wake writes
// anything, so a wake that would be refused costs no bucket request.
func (e *Engine) checkRoom(self *inst) error {
	if e.cfg.MaxAwake <= 0 {
		return nil
	}
	e.capMu.Lock()
	n, victim := e.countAwakeCapHeld(self)
	e.capMu.Unlock()
	if n < e.cfg.MaxAwake || victim != nil {
		return nil
	}
	e.c.capRefusals.Add(1)
	return newCapError()
}

// admitFree admits self under MaxAwake when there is room without sleeping anyone, and
// reports whether it did. A wake whose lease is still in flight takes only such room: an
// eviction waits until the lease is held (makeRoom), so a refused lease costs no other
// space.
func (e *Engine) admitFree(self *inst) bool {
	if e.cfg.MaxAwake <= 0 {
		return true
	}
	e.capMu.Lock()
	defer e.capMu.Unlock()
	return e.admitLocked(self)
}

// admitLocked admits self when the count leaves room. capMu is held.
func (e *Engine) admitLocked(self *inst) bool {
	n, _ := e.countAwakeCapHeld(self)
	if n >= e.cfg.MaxAwake {
		return false
	}
	self.mu.Lock()
	if self.trans != nil {
		self.trans.admitted = true
	}
	self.mu.Unlock()
	return true
}

// makeRoom admits self under MaxAwake, sleeping least recently used idle spaces as
// needed. When every awake space is in use it refuses.
func (e *Engine) makeRoom(self *inst) error {
	if e.cfg.MaxAwake <= 0 {
		return nil
	}
	for {
		e.capMu.Lock()
		if e.admitLocked(self) {
			e.capMu.Unlock()
			return nil
		}
		_, victim := e.countAwakeCapHeld(self)
		e.capMu.Unlock()
		if victim == nil {
			e.c.capRefusals.Add(1)
			self.logger().Warn("awake cap reached and every awake space is in use; wake refused", zap.Int("max_awake", e.cfg.MaxAwake))
			return newCapError()
		}
		if err := e.sleep(e.ctx, victim, reasonLRU); err != nil {
			victim.logger().Error("lru sleep", zap.Error(err))
		}
	}
}
