package engine

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/spacestore"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// wakeSlot orders the writes of one host's wakes/<host> record: each new intent (record
// a time, or delete) bumps gen, and a background retry of an older intent gives up.
type wakeSlot struct {
	mu  sync.Mutex // held across a write, so a retry can never land after a newer write
	gen uint64
}

func (e *Engine) wakeSlotFor(host string) *wakeSlot {
	e.wakeMu.Lock()
	defer e.wakeMu.Unlock()
	s := e.wakeSlots[host]
	if s == nil {
		s = new(wakeSlot)
		e.wakeSlots[host] = s
	}
	return s
}

// setWakeRecord records at under wakes/<host>, or deletes the record when at is nil. A
// write that fails (or cannot be sent while the box is fenced) is retried in the
// background with backoff until it lands, a newer intent for the host replaces it, or
// the engine closes: a lost record is a space that asked to be woken and never is (or
// one woken for nothing, forever, after its route is gone).
func (e *Engine) setWakeRecord(ctx context.Context, host string, at *time.Time) {
	s := e.wakeSlotFor(host)
	s.mu.Lock()
	s.gen++
	gen := s.gen
	var err error
	if e.life.Fenced() {
		err = errFencedNoWrite
	} else {
		err = e.writeWakeRecord(ctx, host, at)
	}
	s.mu.Unlock()
	if err == nil {
		return
	}
	if e.ctx.Err() != nil {
		e.log.Error("scheduled wake record not written; the engine is closed", zap.String("host", host), zap.Error(err))
		return
	}
	e.log.Warn("writing scheduled wake record failed; retrying in the background", zap.String("host", host),
		zap.Bool("delete", at == nil), zap.Error(err))
	safego.Go(&e.wg, e.log, "scheduled wake record", func() { e.retryWakeRecord(s, host, gen, at) })
}

func (e *Engine) retryWakeRecord(s *wakeSlot, host string, gen uint64, at *time.Time) {
	log := e.log.With(zap.String("host", host), zap.Bool("delete", at == nil))
	for attempt := 2; ; attempt++ {
		delay := e.wakeRecordBackoff.After(attempt - 1)
		select {
		case <-e.ctx.Done():
			log.Error("scheduled wake record not written before the engine closed")
			return
		case <-time.After(delay):
		}
		s.mu.Lock()
		if s.gen != gen {
			s.mu.Unlock()
			return // a newer record (or its deletion) replaced this one
		}
		if e.life.Fenced() {
			s.mu.Unlock()
			continue
		}
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		err := e.writeWakeRecord(ctx, host, at)
		cancel()
		s.mu.Unlock()
		if err == nil {
			log.Info("scheduled wake record written", zap.Int("attempts", attempt))
			return
		}
		log.Warn("writing scheduled wake record failed; retrying", zap.Error(err), zap.Duration("in", e.wakeRecordBackoff.After(attempt)))
	}
}

func (e *Engine) writeWakeRecord(ctx context.Context, host string, at *time.Time) error {
	if at == nil {
		return spacestore.DeleteWake(ctx, e.cfg.Bucket, host, "")
	}
	_, err := spacestore.PutWake(ctx, e.cfg.Bucket, host, *at)
	return err
}
