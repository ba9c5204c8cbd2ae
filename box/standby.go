package box

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/standby"
)

// standbyLink is the engine's StandbyLink over the mesh (engine/standby.go): a space's
// standby is the first live box, other than this one and not draining, of the space's
// placement (mesh.Ranked among the members homed like it), reached through the peer API
// under the mesh token; this box's own spool (state_dir/standby) takes the streams of the
// spaces it stands by for, through MeshAPI.
type standbyLink struct {
	ms     *Mesh
	reg    *registry.Registry
	spool  *standby.Spool
	client *standby.Client
}

var _ engine.StandbyLink = (*standbyLink)(nil)

// newStandbyLink opens this box's spool under stateDir.
func newStandbyLink(ms *Mesh, reg *registry.Registry, stateDir string) (*standbyLink, error) {
	sp, err := standby.Open(filepath.Join(stateDir, "standby"))
	if err != nil {
		return nil, fmt.Errorf("opening the standby spool: %w", err)
	}
	return &standbyLink{ms: ms, reg: reg, spool: sp,
		client: &standby.Client{Token: string(ms.client.Token), HTTP: ms.client.HTTPClient}}, nil
}

func (l *standbyLink) self() string { return l.ms.cfg.Self }

// Pick implements engine.StandbyLink.
func (l *standbyLink) Pick(host string) (string, bool) {
	live := l.ms.m.Live()
	region := ""
	if rt, ok := l.reg.Lookup(host); ok {
		region = rt.HomeRegion
	}
	for _, i := range mesh.Ranked(host, live, region) {
		if m := live[i]; m.Self != l.self() && !m.Draining {
			return m.Self, true
		}
	}
	return "", false
}

// Put implements engine.StandbyLink.
func (l *standbyLink) Put(ctx context.Context, box, host string, e standby.Entry) error {
	if box == l.self() {
		return l.spool.Put(host, e)
	}
	return l.client.Put(ctx, box, host, e)
}

// Seal implements engine.StandbyLink: this box's own spool when it is the standby (the
// usual takeover: the standby is next in the space's placement once its holder is gone).
func (l *standbyLink) Seal(ctx context.Context, box, host string, gen int64, claim spacestore.Claim) ([]standby.Entry, error) {
	if box == l.self() {
		return l.spool.Seal(host, gen, claim)
	}
	return l.client.Seal(ctx, box, host, gen, claim)
}

// Retire implements engine.StandbyLink.
func (l *standbyLink) Retire(ctx context.Context, box, host string, gen int64, claim spacestore.Claim, handover bool) error {
	if box == l.self() {
		if handover {
			return l.spool.Handover(host, gen, claim)
		}
		return l.spool.Retire(host, gen, claim)
	}
	return l.client.Retire(ctx, box, host, gen, claim, handover)
}

// Live implements engine.StandbyLink.
func (l *standbyLink) Live(box string) bool { return l.ms.node.IsLiveMember(box) }

// SilentFor implements engine.StandbyLink.
func (l *standbyLink) SilentFor(ctx context.Context, box string) (time.Duration, bool, error) {
	return l.ms.m.SilentFor(ctx, box)
}

// Standby is this box's spool, nil without a mesh: the peer API's standby endpoints.
func (b *Box) Standby() *standby.Spool {
	if b.standby == nil {
		return nil
	}
	return b.standby.spool
}

// releaseTimeout bounds a leaving box's releases (release): each holder proves its stream
// in the bucket and writes one record, milliseconds with the bucket up.
const releaseTimeout = 5 * time.Second

// release, as this box leaves the fleet cleanly (Close, before its heartbeat is deleted),
// asks the holder of each stream its spool keeps to release it (standby/release.go): the
// holder gives the stream up and marks its standby record given up, and a takeover of
// that space then need not wait for this box. A holder that does not answer (cut off,
// dead) leaves its record unmarked: a takeover waits for this box as for one restarting.
func (l *standbyLink) release(logger *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var released, notCurrent, failed int
	for _, s := range l.spool.Unsealed() {
		if s.Claim.Holder == l.self() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := l.client.Release(ctx, s.Claim.Holder, s.Host, l.self(), s.Gen, s.Claim)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				released++
			case errors.Is(err, standby.ErrNotCurrent):
				notCurrent++
				logger.Debug("leaving: the holder does not hold the stream", zap.String("host", s.Host), zap.Error(err))
			default:
				failed++
				logger.Warn("leaving: the holder did not release this box; a takeover of the space waits for it to come back",
					zap.String("host", s.Host), zap.String("holder", s.Claim.Holder), zap.Error(err))
			}
		}()
	}
	wg.Wait()
	if released+notCurrent+failed > 0 {
		logger.Info("leaving: asked the holders this box stands by for to release it", zap.Int("released", released),
			zap.Int("not_current", notCurrent), zap.Int("failed", failed), zap.Duration("took", time.Since(start)))
	}
}
