package engine

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/spacestore"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// WakeReasonHeader tells the instance why it was woken.
const WakeReasonHeader = "X-Lchat-Wake-Reason"

// scanLoop lists wakes/ every WakeScanInterval (one LIST per scan, whatever the number of
// spaces) and fires the due wakes this box fires (Config.Owns, asked with how late each
// is by the bucket's clock).
func (e *Engine) scanLoop() {
	sc := &spacestore.WakeScanner{Bucket: e.cfg.Bucket}
	var mu sync.Mutex
	inFlight := map[string]bool{}
	t := time.NewTicker(e.cfg.WakeScanInterval)
	defer t.Stop()
	for {
		if !e.life.Fenced() && !e.life.Draining() {
			recs, now, err := sc.Scan(e.ctx)
			if err != nil && e.ctx.Err() == nil {
				e.log.Warn("scanning scheduled wakes", zap.Error(err))
			}
			for _, r := range recs {
				if r.At.After(now) || (e.cfg.Owns != nil && !e.cfg.Owns(r.Host, now.Sub(r.At))) {
					continue
				}
				mu.Lock()
				busy := inFlight[r.Host]
				inFlight[r.Host] = true
				mu.Unlock()
				if busy {
					continue
				}
				safego.Go(&e.wg, e.log, "scheduled wake", func() {
					defer func() { mu.Lock(); delete(inFlight, r.Host); mu.Unlock() }()
					e.fireWake(e.ctx, r)
				})
			}
		}
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// resolve finds the route of a host with a due wake. With Config.Resolve it is the only
// authority: a host it does not know has no route here (a removed route, or a live one),
// even if the engine once ran a space under that name.
func (e *Engine) resolve(host string) (Space, bool) {
	if e.cfg.Resolve != nil {
		return e.cfg.Resolve(host)
	}
	if in := e.lookup(host); in != nil {
		in.mu.Lock()
		defer in.mu.Unlock()
		if in.sp.Host != "" {
			return in.sp, true
		}
	}
	return Space{}, false
}

// fireWake wakes the space and POSTs its WakePath until a 2xx, backing off, then deletes the
// record (only if it is still the one that fired). Another box may fire the same record
// (boxes whose views differ, or an overdue wake: Config.Owns); the lease decides which box
// wakes the space, and a box that failed stops retrying once the record is gone or
// replaced (delivered by the other), so a wake is not delivered twice.
func (e *Engine) fireWake(ctx context.Context, r spacestore.WakeRecord) {
	log := e.log.With(zap.String("host", r.Host))
	delay := wakeDeliveryBackoff.Next(0)
	for attempt := 1; ; attempt++ {
		sp, ok := e.resolve(r.Host)
		if !ok {
			// The scan fires only the hosts this box owns (Config.Owns), so no other box
			// serves this one either: its route is gone. Delete the record, if it is
			// still the one listed, rather than skip it at every scan forever.
			if err := spacestore.DeleteWake(ctx, e.cfg.Bucket, r.Host, r.ETag); err != nil {
				log.Warn("deleting the scheduled wake of a host with no route", zap.Error(err))
				return
			}
			log.Info("deleted the scheduled wake of a host with no route", zap.Time("due", r.At))
			return
		}
		err := e.postWake(ctx, sp)
		if err == nil {
			if err := spacestore.DeleteWake(ctx, e.cfg.Bucket, r.Host, r.ETag); err != nil {
				log.Warn("deleting fired scheduled wake", zap.Error(err))
			}
			log.Info("scheduled wake delivered", zap.Time("due", r.At), zap.Int("attempts", attempt))
			return
		}
		if ctx.Err() != nil {
			return
		}
		var re *RetryError
		if errors.As(err, &re) && re.After > delay {
			delay = re.After
		}
		log.Warn("scheduled wake failed; retrying", zap.Error(err), zap.Duration("in", delay))
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		if e.wakeSettled(ctx, r) {
			log.Info("scheduled wake delivered or replaced elsewhere; not retrying", zap.Time("due", r.At), zap.Int("attempts", attempt))
			return
		}
		delay = wakeDeliveryBackoff.Next(delay)
	}
}

// wakeSettled reports whether r is no longer the listed record of its host: deleted (the
// wake was delivered, here or by another box) or replaced by a newer one (which a scan
// fires in its turn). A failed read counts as not settled: the retry goes on.
func (e *Engine) wakeSettled(ctx context.Context, r spacestore.WakeRecord) bool {
	info, err := e.cfg.Bucket.Head(ctx, spacestore.WakeKey(r.Host))
	if errors.Is(err, bucket.ErrNotFound) {
		return true
	}
	return err == nil && r.ETag != "" && info.ETag != r.ETag
}

func (e *Engine) postWake(ctx context.Context, sp Space) error {
	u, err := e.Acquire(ctx, sp)
	if err != nil {
		return err
	}
	defer u.Release()
	kind, _ := e.kind(sp.Kind)
	client := newInstanceClient(u.Socket(), time.Minute)
	defer client.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+sp.Host+kind.WakePath, nil)
	if err != nil {
		return err
	}
	req.Header.Set(WakeReasonHeader, "scheduled")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return errors.New("wake path answered " + resp.Status)
	}
	return nil
}
