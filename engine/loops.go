package engine

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/space"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// WakeReasonHeader tells the instance why it was woken.
const WakeReasonHeader = "X-Lchat-Wake-Reason"

// scanLoop lists wakes/ every WakeScanInterval (one LIST per scan, whatever the number of
// spaces) and fires the due wakes of owned hosts.
func (e *Engine) scanLoop() {
	sc := &space.WakeScanner{Bucket: e.cfg.Bucket}
	var mu sync.Mutex
	inFlight := map[string]bool{}
	t := time.NewTicker(e.cfg.WakeScanInterval)
	defer t.Stop()
	for {
		if !e.fenced.Load() && !e.draining.Load() {
			recs, now, err := sc.Scan(e.ctx)
			if err != nil && e.ctx.Err() == nil {
				e.log.Warn("scanning scheduled wakes", zap.Error(err))
			}
			for _, r := range recs {
				if r.At.After(now) || (e.cfg.Owns != nil && !e.cfg.Owns(r.Host)) {
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
// record (only if it is still the one that fired).
func (e *Engine) fireWake(ctx context.Context, r space.WakeRecord) {
	log := e.log.With(zap.String("host", r.Host))
	delay := time.Second
	for attempt := 1; ; attempt++ {
		sp, ok := e.resolve(r.Host)
		if !ok {
			// The scan fires only the hosts this box owns (Config.Owns), so no other box
			// serves this one either: its route is gone. Delete the record, if it is
			// still the one listed, rather than skip it at every scan forever.
			if err := space.DeleteWake(ctx, e.cfg.Bucket, r.Host, r.ETag); err != nil {
				log.Warn("deleting the scheduled wake of a host with no route", zap.Error(err))
				return
			}
			log.Info("deleted the scheduled wake of a host with no route", zap.Time("due", r.At))
			return
		}
		err := e.postWake(ctx, sp)
		if err == nil {
			if err := space.DeleteWake(ctx, e.cfg.Bucket, r.Host, r.ETag); err != nil {
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
		delay = min(delay*2, 5*time.Minute)
	}
}

func (e *Engine) postWake(ctx context.Context, sp Space) error {
	u, err := e.Acquire(ctx, sp)
	if err != nil {
		return err
	}
	defer u.Release()
	kind, _ := e.kind(sp.Kind)
	client := &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", u.Socket())
		}},
		Timeout: time.Minute,
	}
	defer client.CloseIdleConnections()
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

// drainParallel bounds how many spaces sleep at once during a drain.
const drainParallel = 8

// Drain sleeps every awake space (in parallel, bounded): checkpoint and lease release. New
// Acquires are refused from the start.
func (e *Engine) Drain(ctx context.Context) error {
	e.draining.Store(true)
	sem := make(chan struct{}, drainParallel)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, in := range e.all() {
		in.mu.Lock()
		t, st := in.trans, in.state
		in.mu.Unlock()
		if st == StateWaking && t != nil {
			select {
			case <-t.done:
			case <-ctx.Done():
			}
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			safego.Run(e.log, "drain", func() {
				err := e.sleep(ctx, in, "drain", false)
				if err == nil {
					err = e.flushDirty(ctx, in)
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// SetFenced is driven by the mesh heartbeat. Fenced: stop serving and writing (instances are
// stopped; nothing is written; local state is kept). Unfenced: every held space's lease and
// manifest are re-read; if still this box's, its local state is checkpointed and the lease
// released; otherwise the local state is dropped. Only then are the spaces served again.
func (e *Engine) SetFenced(fenced bool) {
	if e.fenced.Swap(fenced) == fenced {
		return
	}
	reason := "unfenced"
	if fenced {
		reason = "fenced: heartbeat writes failing"
	}
	e.emit(Event{Type: EventFence, Reason: reason})
	if fenced {
		e.log.Warn("fenced: heartbeat writes failing; stopping every awake space without writing")
		for _, in := range e.all() {
			safego.Go(&e.wg, e.log, "fence stop", func() {
				// A sync in flight holds the op lock while it waits on the bucket this
				// box can no longer reach: cancel it first so the stop is not held up.
				in.mu.Lock()
				in.stopSyncLocked()
				in.mu.Unlock()
				in.op.Lock()
				defer in.op.Unlock()
				in.mu.Lock()
				if in.state != StateAwake {
					in.mu.Unlock()
					return
				}
				p, kind := in.proc, in.kind
				t := &transition{done: make(chan struct{})}
				in.trans = t
				in.disarmIdleLocked()
				in.stopSyncLocked()
				in.setStateLocked(StateSleeping)
				in.mu.Unlock()
				if g := e.cfg.FenceStopGrace; g > 0 && kind.StopGrace > g {
					kind.StopGrace = g
				}
				e.stopProcess(in, p, kind)
				in.mu.Lock()
				in.proc = nil
				in.trans = nil
				in.held = in.leaseETag != ""
				in.setStateLocked(StateFenced)
				close(t.done)
				in.mu.Unlock()
			})
		}
		return
	}
	e.log.Info("unfenced: re-reading leases of held spaces")
	for _, in := range e.all() {
		safego.Go(&e.wg, e.log, "unfence", func() { e.recheck(in) })
	}
}

// recheck resolves a space stopped by a heartbeat fence.
func (e *Engine) recheck(in *inst) {
	in.op.Lock()
	defer in.op.Unlock()
	in.mu.Lock()
	held, etag := in.held, in.leaseETag
	in.mu.Unlock()
	if !held || e.fenced.Load() {
		return
	}
	log := in.logger()
	ctx := e.ctx
	ours, err := space.StillHeld(ctx, e.cfg.Bucket, in.host, etag, e.holder)
	if err == nil && ours && in.syncer != nil {
		_, cur, rerr := space.ReadManifest(ctx, e.cfg.Bucket, in.host)
		_, mine := in.syncer.Manifest()
		err = rerr
		ours = cur == mine
	}
	if err != nil {
		log.Warn("re-reading lease after fence; will retry on next unfence", zap.Error(err))
		return
	}
	if ours {
		err = e.checkpointAndRelease(ctx, in)
	} else {
		e.c.fenced.Add(1)
		log.Warn("lease or manifest taken over while fenced; dropping local state")
	}
	if err != nil {
		log.Warn("checkpoint after fence failed; still held", zap.Error(err))
		return
	}
	in.mu.Lock()
	in.held = false
	if !ours {
		in.leaseETag = ""
	}
	in.setStateLocked(StateAsleep)
	in.mu.Unlock()
}

// flushDirty retries the checkpoint of a space that went to sleep with a failed checkpoint.
func (e *Engine) flushDirty(ctx context.Context, in *inst) error {
	in.op.Lock()
	defer in.op.Unlock()
	in.mu.Lock()
	dirty := in.dirty && in.state != StateAwake && in.state != StateFenced
	in.mu.Unlock()
	if !dirty || e.fenced.Load() {
		return nil
	}
	in.mu.Lock()
	in.dirty = false
	in.mu.Unlock()
	return e.checkpointAndRelease(ctx, in)
}
