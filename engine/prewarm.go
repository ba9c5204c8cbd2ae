package engine

import (
	"context"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/spacestore"
)

// A space's standby box keeps the space warm: when a stream of a new generation starts
// there (a wake or a checkpoint of the holder), the standby restores that generation's
// checkpoint into the space's data dir on this box, over the one it holds by what changed,
// and records it for reuse (spacestore.Syncer.Warm). A takeover here then loads the same manifest, finds the data
// dir holding it, and downloads nothing: it applies the log and the stream on top, as any
// wake does, so its time does not grow with the space's size. The copy is only a cache:
// the reuse record's checks (the manifest's ETag, the data dir's stat signature, this
// boot) decide at the takeover, and any doubt is a full restore.

// warmTimeout bounds one warming (a download of the whole space).
const warmTimeout = 10 * time.Minute

// Prewarm warms host's current checkpoint on this box, in the background: the box's
// standby spool calls it when a stream of a new generation starts here, and when the
// space's holder hands it over on a drain (it slept there and wakes here next). Only a
// space asleep here, of a kind whose durability is standby, is warmed. Calls for a host
// already warming are folded into one more warming after the running one.
func (e *Engine) Prewarm(host string) {
	if e.cfg.Resolve == nil || !validHost(host) {
		return
	}
	in := e.get(host)
	in.warmAsked.Add(1)
	if !in.warming.CompareAndSwap(false, true) {
		return // the running warming sees the new ask when it ends
	}
	safego.Go(&e.wg, e.log, "warm a standby copy", func() {
		for {
			asked := in.warmAsked.Load()
			e.warm(in)
			in.warming.Store(false)
			if in.warmAsked.Load() == asked || !in.warming.CompareAndSwap(false, true) {
				return
			}
		}
	})
}

// warm is one warming of in: its current checkpoint restored into its data dir and
// recorded for reuse; nothing downloaded when the data dir already holds it.
func (e *Engine) warm(in *inst) {
	log := in.logger()
	sp, ok := e.cfg.Resolve(in.host)
	if !ok {
		return
	}
	kind, ok := e.kind(sp.Kind)
	if !ok || kind.Durability != DurabilityStandby {
		return
	}
	in.op.Lock()
	defer in.op.Unlock()
	in.mu.Lock()
	asleep := in.state == StateAsleep && in.trans == nil
	if asleep {
		in.sp, in.kind = sp, kind // as a wake would: the status names the space's kind
	}
	in.mu.Unlock()
	if !asleep || e.ctx.Err() != nil || e.life.Fenced() {
		return // running, waking, or holding state the bucket lacks: nothing to warm
	}
	began := e.now()
	ctx, cancel := context.WithTimeout(e.ctx, warmTimeout)
	defer cancel()
	s := e.syncerOf(in)
	s.Retention, s.GCGrace = kind.Retention, kind.GCGrace
	if _, err := e.attachDisk(in, kind); err != nil {
		log.Warn("not warming the standby copy: the space's disk", zap.Error(err))
		return
	}
	if err := s.Load(ctx); err != nil {
		log.Warn("not warming the standby copy: loading the manifest", zap.Error(err))
		return
	}
	m, _ := s.Manifest()
	if m == nil {
		return // never checkpointed nor fenced: nothing to warm
	}
	in.warmGen.Store(0)
	fetched, err := s.Warm(ctx)
	if err != nil {
		log.Warn("warming the standby copy", zap.Int64("generation", m.Generation), zap.Error(err))
		return
	}
	in.warmGen.Store(m.Generation + 1)
	in.mu.Lock()
	in.size = manifestSize(m)
	in.mu.Unlock()
	if fetched > 0 {
		log.Info("standby copy warm", zap.Int64("generation", m.Generation), zap.Int64("bytes", manifestSize(m)),
			zap.Int64("fetched", fetched), zap.Duration("took", e.now().Sub(began)))
	}
}

// keepRestored (in.op held), for a wake that restored the manifest and stopped before
// anything ran on it (its lease refused: the holder's heartbeat still looks live, say),
// records the data dir for the next wake here: a standby's box asked to serve the space
// before its takeover keeps its warm copy so.
func (e *Engine) keepRestored(in *inst) {
	if err := in.syncer.KeepRestored(); err != nil {
		in.logger().Debug("the restored data dir is not kept for the next wake", zap.Error(err))
		return
	}
	if m, _ := in.syncer.Manifest(); m != nil {
		in.warmGen.Store(m.Generation + 1)
	}
}

// syncerOf is in's syncer, made on first use (in.op held).
func (e *Engine) syncerOf(in *inst) *spacestore.Syncer {
	if in.syncer == nil {
		in.syncer = &spacestore.Syncer{Bucket: e.cfg.Bucket, Host: in.host, DataDir: in.dataDir,
			WorkDir: filepath.Join(in.dir, "work"), WrittenBy: e.cfg.Holder}
	}
	return in.syncer
}

// WarmGeneration is the generation of host's checkpoint this box last warmed as its
// standby (Prewarm); ok false when none. A wake here consumes it.
func (e *Engine) WarmGeneration(host string) (gen int64, ok bool) {
	in := e.lookup(host)
	if in == nil {
		return 0, false
	}
	g := in.warmGen.Load()
	return g - 1, g > 0
}
