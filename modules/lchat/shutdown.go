package lchat

import (
	"context"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// A process shutdown (SIGTERM, SIGINT, `lchat-caddy stop`) drains at once. Caddy stops
// its apps one after the other and cleans up (our Destruct) only after the http app has
// stopped, and the http app waits for open requests: one open SSE stream or WebSocket
// to a space -- which ends only when the space's instance stops, that is, in the drain --
// held the whole shutdown for the grace period (forever with Caddy's default) before the
// drain could start. So the drain does not wait for the http app: as soon as Caddy says
// the process is exiting, the spaces are drained (the heartbeat marked draining, every
// instance stopped, checkpointed and its lease released). Their streams end with their
// instances, the http app's shutdown finishes on its own, and the whole stop takes the
// drain's time, bounded by drain_timeout. A config reload never sets caddy.Exiting.
//
// Caddy offers no hook that runs before its apps stop except the events app, which a
// config may not load, so a small loop watches caddy.Exiting.

// exitPoll is how often the exit watch looks at caddy.Exiting.
const exitPoll = 50 * time.Millisecond

// drainState runs the drain once, whoever asks first: the exit watch or Destruct.
type drainState struct {
	once sync.Once
	err  error
	stop chan struct{} // closed by Destruct: ends the exit watch
}

// watchExit starts the drain as soon as the process is exiting.
func (s *shared) watchExit() {
	s.drain.stop = make(chan struct{})
	stop := s.drain.stop
	safego.Go(nil, s.logger, "exit watch", func() {
		t := time.NewTicker(exitPoll)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if caddy.Exiting() {
					s.logger.Info("process exiting: draining spaces now, before the servers finish shutting down")
					s.drainSpaces()
					return
				}
			}
		}
	})
}

// drainSpaces marks the heartbeat draining and sleeps every awake space, once.
func (s *shared) drainSpaces() error {
	s.drain.once.Do(func() {
		if s.mesh != nil {
			s.mesh.markDraining()
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.drainTimeout)
		defer cancel()
		s.drain.err = s.eng.Drain(ctx)
		if s.drain.err != nil {
			s.logger.Warn("drain", zap.Error(s.drain.err))
		}
	})
	return s.drain.err
}
