package engine

import (
	"context"
	"errors"
	"sync"

	"github.com/lchat/lchat-caddy/internal/safego"
)

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
