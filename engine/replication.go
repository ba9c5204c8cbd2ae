package engine

import (
	"context"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/spacestore"
)

// continuousPoll is how often the continuous class looks at the data dir's mtimes, and
// continuousMaxDelay bounds how long a change waits for the writes to settle.
const (
	continuousPoll     = 200 * time.Millisecond
	continuousMaxDelay = time.Second
)

// startSync starts the awake space's replication loop, per its kind's class.
func (e *Engine) startSync(in *inst, kind Kind) {
	if kind.Replication.Class == ReplicateSleep {
		return
	}
	ctx, cancel := context.WithCancel(e.ctx)
	in.mu.Lock()
	in.stopSyncLocked()
	in.syncStop = cancel
	in.mu.Unlock()
	if kind.Replication.Class == ReplicateContinuous {
		// The baseline is taken here, before the wake returns its first Use: a write the
		// first request makes must count as a change, however late the loop starts.
		base, _ := dirStamp(in.dataDir)
		safego.Go(&e.wg, e.log, "continuous sync", func() { e.continuousLoop(ctx, in, base) })
		return
	}
	safego.Go(&e.wg, e.log, "periodic sync", func() {
		t := time.NewTicker(kind.Replication.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				e.syncNow(ctx, in)
			}
		}
	})
}

func (in *inst) stopSyncLocked() {
	if in.syncStop != nil {
		in.syncStop()
		in.syncStop = nil
	}
}

// CheckpointNow checkpoints host's space at once if it is awake here, as its periodic
// checkpoint would (whatever its replication class): held connections ask for one when
// the messages their app acknowledged pile up, since a message is dropped by the box only
// once a checkpoint that began after its acknowledgement completed. A space that is not
// awake here is left alone (its sleep checkpointed it); the result is reported to
// observers as every checkpoint is.
func (e *Engine) CheckpointNow(ctx context.Context, host string) {
	in := e.lookup(host)
	if in == nil {
		return
	}
	e.syncNow(ctx, in)
}

// syncNow checkpoints an awake space while it runs.
func (e *Engine) syncNow(ctx context.Context, in *inst) {
	if e.life.Fenced() {
		return
	}
	in.op.Lock()
	defer in.op.Unlock()
	if ctx.Err() != nil {
		return // the space began sleeping while we waited; its sleep checkpoints
	}
	in.mu.Lock()
	awake := in.state == StateAwake
	in.mu.Unlock()
	if !awake || in.syncer == nil {
		return
	}
	prev, _ := in.syncer.Manifest()
	var next *time.Time
	if prev != nil {
		next = prev.NextWake // scheduled wakes are recorded at sleep
	}
	if e.checkpointOpHeld(ctx, in, spacestore.Periodic, next) == nil && in.syncer.FoldDue() {
		// Bound what a wake after a crash reads: merge the newest deltas now, as a
		// checkpoint of its own (under the lease, conditioned on the manifest's ETag).
		e.checkpointOpHeld(ctx, in, spacestore.Fold, next)
	}
}

// continuousLoop checkpoints within about a second of a change: it polls the data dir's
// mtimes and syncs once they are stable for one poll, or continuousMaxDelay after the first
// change seen, whichever is sooner.
// base is the data dir's stamp as of the wake.
func (e *Engine) continuousLoop(ctx context.Context, in *inst, base uint64) {
	debounce(ctx, e.now, base, func() (uint64, error) { return dirStamp(in.dataDir) }, func() { e.syncNow(ctx, in) })
}

// debounce calls sync after stamp changes from synced (the stamp of what was last saved):
// once it is stable for one poll, or continuousMaxDelay after the first change seen,
// whichever is sooner. now is the engine's clock.
func debounce(ctx context.Context, now func() time.Time, synced uint64, stamp func() (uint64, error), sync func()) {
	t := time.NewTicker(continuousPoll)
	defer t.Stop()
	var last uint64
	var dirtySince time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur, err := stamp()
		if err != nil {
			continue
		}
		if cur == synced {
			dirtySince = time.Time{}
			continue
		}
		at := now()
		if dirtySince.IsZero() {
			dirtySince, last = at, cur
			continue
		}
		if cur != last && at.Sub(dirtySince) < continuousMaxDelay {
			last = cur
			continue
		}
		sync()
		synced, dirtySince = cur, time.Time{}
	}
}

// dirStamp hashes the names, sizes and mtimes under dir: cheap change detection, no reads.
func dirStamp(dir string) (uint64, error) {
	h := fnv.New64a()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		fmt.Fprintf(h, "%s|%d|%d\n", p, info.Size(), info.ModTime().UnixNano())
		return nil
	})
	return h.Sum64(), err
}
