package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// drainParallel bounds how many spaces sleep at once during a drain.
const drainParallel = 8

// drainUseGrace bounds how long a drain waits for the requests already in a space to
// finish before it stops the instance: a request finishes in milliseconds, a stream that
// outlives the grace (one not held by the box, see connhold) is cut. A variable so a
// test can hold a request for as long as it needs.
var drainUseGrace = 2 * time.Second

// Drain sleeps every awake space (in parallel, bounded): checkpoint and lease release. New
// Acquires are refused from the start.
func (e *Engine) Drain(ctx context.Context) error {
	e.life.Drain()
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
				e.quiesce(ctx, in)
				err := e.sleep(ctx, in, "drain")
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

// quiesce stops giving out Uses of in and waits, at most drainUseGrace or until ctx ends,
// for those already given out (and the Acquires waiting on its wake, which then get
// ErrDraining) to end: a request that got the instance just before its drain is answered,
// not cut, and the ones after it go to the box that takes the space over.
func (e *Engine) quiesce(ctx context.Context, in *inst) {
	in.mu.Lock()
	in.drainLocked()
	in.mu.Unlock()
	deadline := time.NewTimer(drainUseGrace)
	defer deadline.Stop()
	for {
		in.mu.Lock()
		busy := in.uses > 0 || in.waiters > 0
		changed := in.changesLocked()
		in.mu.Unlock()
		if !busy {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		}
	}
}
