package engine

import (
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// armIdleLocked starts the idle timer of an awake period. The timer re-arms itself for as
// long as the space is in use or was used within IdleTimeout (idleCheck).
func (in *inst) armIdleLocked() {
	in.disarmIdleLocked()
	if in.state != StateAwake || in.e.ctx.Err() != nil {
		return
	}
	gen := in.idleGen
	in.idle = time.AfterFunc(in.kind.IdleTimeout, func() { in.idleCheck(gen) })
}

// idleDueLocked reports whether the space has been idle for IdleTimeout, and otherwise how
// long until it could be.
func (in *inst) idleDueLocked(now time.Time) (bool, time.Duration) {
	timeout := in.kind.IdleTimeout
	if in.uses > 0 || in.waiters > 0 {
		return false, timeout
	}
	if wait := in.lastUsed.Add(timeout).Sub(now); wait > 0 {
		return false, wait
	}
	return true, 0
}

// idleCheck runs when the idle timer fires: sleep the space if it is due, else re-arm.
func (in *inst) idleCheck(gen uint64) {
	e := in.e
	in.mu.Lock()
	if gen != in.idleGen || in.state != StateAwake || e.ctx.Err() != nil {
		in.mu.Unlock()
		return
	}
	if due, wait := in.idleDueLocked(e.now()); !due {
		in.idle.Reset(wait)
		in.mu.Unlock()
		return
	}
	in.mu.Unlock()
	safego.Go(&e.wg, e.log, "idle sleep", func() { e.idleFire(in, gen) })
}

func (in *inst) disarmIdleLocked() {
	in.idleGen++
	if in.idle != nil {
		in.idle.Stop()
		in.idle = nil
	}
}

func (e *Engine) idleFire(in *inst, gen uint64) {
	in.mu.Lock()
	stale := gen != in.idleGen || in.state != StateAwake
	in.mu.Unlock()
	if stale {
		return
	}
	if err := e.sleep(e.ctx, in, reasonIdle); err != nil {
		in.logger().Error("idle sleep", zap.Error(err))
	}
}
