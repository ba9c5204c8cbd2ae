// Package safego runs goroutines that survive their own panics: every goroutine lchat-caddy
// starts goes through Go (or wraps its body in Run), so a bug in one space, peer or loop is
// logged with its stack instead of taking the box and every other space down with it.
package safego

import (
	"runtime/debug"
	"sync"

	"go.uber.org/zap"
)

// Go runs f on a new goroutine, logging a panic in f with its stack instead of crashing.
// A non-nil wg counts the goroutine: Add before it starts, Done when f returns or panics.
func Go(wg *sync.WaitGroup, logger *zap.Logger, name string, f func()) {
	if wg != nil {
		wg.Add(1)
	}
	go func() {
		if wg != nil {
			defer wg.Done()
		}
		Run(logger, name, f)
	}()
}

// Run calls f and recovers a panic in it, logging it with its stack. It returns the
// panic's value, nil when f returned normally, so a caller can turn it into its answer.
func Run(logger *zap.Logger, name string, f func()) (panicked any) {
	defer func() {
		if r := recover(); r != nil {
			if logger == nil {
				logger = zap.L()
			}
			logger.Error("panic", zap.String("goroutine", name), zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
			panicked = r
		}
	}()
	f()
	return nil
}
