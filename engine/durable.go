package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/gate"
	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/spacestore"
)

// Durable acknowledgements (Kind.Durability DurabilityBucket, the default). While a space
// of such a kind is awake its SQLite commits are shipped, in groups, to its log in the
// bucket (spacestore/log.go), and every answer of its instance waits at its output gate
// (package gate) until the segment cut after the answer reached the box, and every one
// before it, has landed: a write the box acknowledged survives the death of its box, disk
// included. Segments are cut one at a time under durable.mu and appended several at once
// (the gate's pipeline).
//
// The wake reads the log of the manifest's generation after the fence, applies it to the
// restored data dir and seals it (spacestore.SealLog) before the instance starts, so an
// earlier holder's next segment fails (ErrLogSealed) and that box acknowledges nothing
// more. Cuts and checkpoints take turns (durable.mu): a checkpoint that swaps a new
// generation covers every segment cut before it, and the log starts again, at 1, under
// the new generation; the older logs stay as long as their checkpoints' history entries
// (spacestore.Collect), for point-in-time restore.
//
// What the log does not carry, a checkpoint still does: databases not in WAL mode and
// every other file (logged at wake, in Status as log_skipped).

// segmentTimeout bounds one append of a segment: a bucket that never answers does not hold
// the shipper (and the checkpoint that waits for it) past it; the gate tries again.
const segmentTimeout = 10 * time.Second

// DurableAnswerTimeout bounds how long an answer waits at the gate before the client gets
// 503 (the instance's answer dropped): a box cut off from the bucket acknowledges nothing.
const DurableAnswerTimeout = 10 * time.Second

// logEvery is how often an awake space's log is shipped with no answer waiting: what the
// instance commits on its own (a timer's write) is durable within it.
const logEvery = time.Second

// pipelineOver is the landing time past which a space's log lands several segments at once
// (gate.Config.PipelineOver): a bucket slower than it (S3 Standard's PUTs take tens of
// milliseconds) keeps a write's wait near one PUT with the pipeline; a faster one lands one
// segment at a time, each carrying the writes that arrived meanwhile: side by side under 64
// writers on a local bucket, about a third fewer bucket requests and CPU per write, and more
// throughput (docs/durability-figures.md).
const pipelineOver = 10 * time.Millisecond

// durable is an awake space's log and output gate: made by the wake once the log is
// sealed, closed by the stop.
type durable struct {
	gate  *gate.Gate
	claim spacestore.Claim

	// mu gives the shipper one user at a time: a cut of the next segment, or a checkpoint
	// (which starts the next generation's log). The appends of the segments cut run
	// outside it, several at once (the gate's pipeline). Lock order: inst.op, then mu.
	mu      sync.Mutex
	shipper *spacestore.LogShipper

	// What status reads, without mu: segments landed and their page images' bytes, where
	// the log stands, the files it skips. gen is also what an append checks: a segment of
	// an older generation is covered by the checkpoint that started the current one.
	segments atomic.Uint64
	bytes    atomic.Uint64
	// unproven is the bytes of the segments cut and not landed; genSegments the segments
	// landed under the current generation, and folded those a checkpoint's new generation
	// covered (landed or still in flight then).
	unproven    atomic.Int64
	genSegments atomic.Uint64
	folded      atomic.Uint64
	gen         atomic.Int64
	next        atomic.Int64
	skipped     atomic.Pointer[[]spacestore.SkippedFile]

	// sb is the stream to the standby (standby.go), nil unless the kind's durability is
	// standby; its counters: segments the standby took, standbys given up.
	sb        *streamer
	noStandby string // why a standby kind has no stream (sb nil)
	// unsure is set while the last checkpoint's manifest write may have landed with its
	// answer lost (spacestore.Syncer.Unsure): the bucket may be a generation ahead, whose
	// checkpoint holds only what was committed before it, so a segment of this generation's
	// log or stream, landed now, might be ignored by a takeover: nothing is acknowledged
	// until a checkpoint settles it (settleUnsure). settling: one such checkpoint in flight.
	unsure      atomic.Bool
	settling    atomic.Bool
	streamed    atomic.Uint64
	standbyLost atomic.Uint64
}

// answers is the gate the instance's answers wait on: the stream's, else the bucket log's.
func (d *durable) answers() *gate.Gate {
	if d.sb != nil {
		return d.sb.gate
	}
	return d.gate
}

// openLog, for a wake of a space whose kind has DurabilityBucket, with in.op held, the
// lease held and the manifest fenced: reads the log of the restored generation, applies
// it to the data dir (unless kept: a wake from unsaved that kept its newer local state,
// which holds that log), seals it with this wake's claim and returns where shipping goes
// on from the seal (newDurable, once the instance started: its page reader runs under the
// instance's uid). Segments that land before the seal are applied too.
func (e *Engine) openLog(ctx context.Context, in *inst, kept bool) (*logStart, error) {
	m, _ := in.syncer.Manifest()
	if m == nil || m.Claim == nil {
		return nil, errors.New("opening the log: the manifest is not fenced")
	}
	gen, claim := m.Generation, *m.Claim
	lg, err := spacestore.ReadLog(ctx, e.cfg.Bucket, in.host, gen)
	if err != nil {
		return nil, fmt.Errorf("reading the log: %w", err)
	}
	var base *spacestore.LogBase // nil: every database shipped whole at first
	if !kept {
		base = in.syncer.LogBase()
		rec, stream, err := e.takeStream(ctx, in, gen, claim, lg)
		if err != nil {
			return nil, err
		}
		if stream != nil {
			err = e.applyStream(ctx, in, base, lg, rec, stream)
		} else {
			err = in.syncer.ApplySegments(base, lg.Segments)
		}
		if err != nil {
			return nil, fmt.Errorf("applying the log: %w", err)
		}
	}
	more, next, err := spacestore.SealLog(ctx, e.cfg.Bucket, in.host, gen, claim, lg)
	if err != nil {
		return nil, fmt.Errorf("sealing the log: %w", err)
	}
	if !kept && len(more) > 0 {
		if err := in.syncer.ApplySegments(base, more); err != nil {
			return nil, fmt.Errorf("applying the log: %w", err)
		}
	}
	if n := len(lg.Segments) + len(more); n > 0 {
		in.logger().Info("log applied and sealed", zap.Int64("generation", gen), zap.Int("segments", n), zap.Int64("next", next))
	}
	return &logStart{base: base, gen: gen, next: next, claim: claim}, nil
}

// logStart is where a woken space's log goes on from: the seal's next seq.
type logStart struct {
	base      *spacestore.LogBase
	gen, next int64
	claim     spacestore.Claim
}

// newDurable is the durable part of in, shipping from ls, once its instance has started
// (in.syncer.PageReader is then the instance's).
func (e *Engine) newDurable(in *inst, ls *logStart) *durable {
	d := &durable{claim: ls.claim, shipper: spacestore.NewLogShipper(in.dataDir, in.syncer.PageReader, ls.base, ls.gen, ls.next, ls.claim)}
	d.gen.Store(ls.gen)
	d.next.Store(ls.next)
	d.gate = gate.New(gate.Config{
		Cut:          func(ctx context.Context) (gate.Land, error) { return e.cutSegment(ctx, in, d) },
		PipelineOver: pipelineOver,
		Every:        logEvery,
		Now:          e.now,
		Logger:       in.logger(),
	})
	in.mu.Lock()
	standbyKind := in.kind.Durability == DurabilityStandby
	in.mu.Unlock()
	switch {
	case standbyKind && e.cfg.Standby != nil:
		// The stream builds on the state the wake left: the seal (next-1) of the log.
		d.sb = e.newStreamer(in, d, ls.base.Clone(), ls.gen, ls.next-1)
	case standbyKind:
		d.noStandby = "this box is not in a mesh: the space's answers wait for the bucket log"
		in.logger().Warn("durability standby without a mesh: the space's answers wait for the bucket log")
	}
	return d
}

// checkpointForTheLog checkpoints in in the background: changes too large for a segment
// go up in a checkpoint instead (off the gate's goroutine: the checkpoint takes inst.op,
// which a stop holds while it closes the gate).
func (e *Engine) checkpointForTheLog(in *inst) {
	safego.Go(&e.wg, e.log, "checkpoint for the log", func() { e.syncNow(e.ctx, in) })
}

// cutSegment takes what the instance committed since the last segment into the next one
// (the gate's Cut) and returns its append, nil when nothing was committed. Changes too
// large for a segment are checkpointed instead (off the gate's goroutine: the checkpoint
// takes inst.op, which a stop holds while it closes the gate); the gate's retry then
// finds nothing new.
func (e *Engine) cutSegment(ctx context.Context, in *inst, d *durable) (gate.Land, error) {
	if e.life.Fenced() {
		return nil, errFencedNoWrite // the gate retries; past its deadline the answer is a 503
	}
	d.mu.Lock()
	// Under d.mu: a checkpoint that ran while this cut waited for it may have left its
	// manifest write unsure, and what the cut would take then be in no log a takeover reads.
	if err := e.settleUnsure(in, d); err != nil {
		d.mu.Unlock()
		return nil, err
	}
	seg, err := d.shipper.Next(ctx, e.now())
	skipped := d.shipper.Skipped()
	d.skipped.Store(&skipped)
	d.next.Store(d.shipper.NextSeq())
	d.mu.Unlock()
	if errors.Is(err, spacestore.ErrSegmentTooLarge) {
		e.checkpointForTheLog(in)
		return nil, err
	}
	if err != nil || seg == nil {
		return nil, err
	}
	size := int64(0)
	for _, db := range seg.DBs {
		size += int64(len(db.LTX))
	}
	d.unproven.Add(size)
	proven := false // the gate calls a shipment's Land from one goroutine, in turn
	return func(ctx context.Context) error {
		err := e.appendSegment(ctx, in, d, seg)
		if err == nil && !proven {
			proven = true
			d.unproven.Add(-size)
		}
		return err
	}, nil
}

// appendSegment lands seg in the space's log (the gate's Land; the gate calls it again
// after an error until it lands). A log another holder sealed fences the space out; its
// answers get ErrFenced at once.
func (e *Engine) appendSegment(ctx context.Context, in *inst, d *durable, seg *spacestore.Segment) error {
	if d.gen.Load() > seg.Gen {
		// A checkpoint swapped a newer generation since the cut: it read the files after
		// the cut (under d.mu), so it holds what seg carried, and the log of seg's
		// generation is obsolete.
		d.folded.Add(1)
		return nil
	}
	if e.life.Fenced() {
		return errFencedNoWrite
	}
	actx, cancel := context.WithTimeout(ctx, segmentTimeout)
	err := spacestore.AppendSegment(actx, e.cfg.Bucket, in.host, seg)
	cancel()
	switch {
	case err == nil:
		d.segments.Add(1)
		d.genSegments.Add(1)
		for _, db := range seg.DBs {
			d.bytes.Add(uint64(len(db.LTX)))
		}
		return nil
	case errors.Is(err, spacestore.ErrLogSealed):
		in.logger().Error("log sealed by another holder: this instance acknowledges nothing more", zap.Error(err))
		safego.Go(&e.wg, e.log, "fence out", func() {
			in.op.Lock()
			defer in.op.Unlock()
			if in.durableOf() == d { // else a stop (or a new wake) came first: nothing to fence
				e.fenceOut(in)
			}
		})
		return fmt.Errorf("%w: %w", gate.ErrFenced, err)
	}
	return err
}

// errUnsure is why nothing is acknowledged while a manifest write's outcome is unknown.
var errUnsure = errors.New("the last checkpoint's manifest write may have landed: acknowledging nothing until a checkpoint settles it")

// unsureRetry spaces the checkpoints that try to settle an unsure manifest write.
const unsureRetry = 500 * time.Millisecond

// settleUnsure returns errUnsure while d is unsure, after starting (one at a time) a
// checkpoint that settles it: its manifest write, conditioned as every one is, adopts the
// lost write when it landed (a new generation) or lands over the old one.
func (e *Engine) settleUnsure(in *inst, d *durable) error {
	if !d.unsure.Load() {
		return nil
	}
	if d.settling.CompareAndSwap(false, true) {
		safego.Go(&e.wg, e.log, "checkpoint to settle a manifest write", func() {
			defer d.settling.Store(false)
			select {
			case <-e.ctx.Done():
				return
			case <-time.After(unsureRetry):
			}
			e.syncNow(e.ctx, in) // a manifest write settles it
			e.settleOpHeld(in)   // with nothing to write: read the manifest
		})
	}
	return errUnsure
}

// settleOpHeld settles d's unsure manifest write by reading the manifest (Syncer.Settle),
// when the checkpoint that tried had nothing to write: adopted, the log starts again under
// its generation (nothing changed since that checkpoint read the data dir, or the
// checkpoint would have written); another writer's manifest fences the space out.
func (e *Engine) settleOpHeld(in *inst) {
	in.op.Lock()
	defer in.op.Unlock()
	d := in.durableOf()
	if d == nil || !d.unsure.Load() || e.life.Fenced() {
		return
	}
	ctx, cancel := context.WithTimeout(e.ctx, segmentTimeout)
	defer cancel()
	d.mu.Lock()
	adopted, err := in.syncer.Settle(ctx)
	if adopted {
		e.newGeneration(in, d)
	}
	d.unsure.Store(in.syncer.Unsure())
	d.mu.Unlock()
	if errors.Is(err, spacestore.ErrFenced) {
		e.fenceOut(in)
	}
}

// newGeneration, after a checkpoint of in swapped a new manifest generation (with d.mu
// and inst.op held), starts the log again under it.
func (e *Engine) newGeneration(in *inst, d *durable) {
	m, _ := in.syncer.Manifest()
	if m == nil || m.Generation == d.shipper.Gen() {
		return
	}
	d.shipper.Close()
	d.shipper = spacestore.NewLogShipper(in.dataDir, in.syncer.PageReader, in.syncer.LogBase(), m.Generation, 1, d.claim)
	if d.sb != nil {
		e.restartStream(in, d, d.sb, in.syncer.LogBase(), m.Generation)
	}
	d.gen.Store(m.Generation)
	d.next.Store(1)
	d.folded.Add(d.genSegments.Swap(0))
	// The log of the generation before stays: point-in-time restore applies it on top of
	// that checkpoint, and GC collects it with the checkpoint's history entry
	// (spacestore.Collect).
}

// durableOf is in's durable part, nil when its kind does not ship a log or it is not
// awake.
func (in *inst) durableOf() *durable { return in.dur.Load() }

// closeDurable ends in's durable part, if any: answers still waiting fail with err (nil:
// the space stopped) and no shipment follows.
func (in *inst) closeDurable(err error) {
	if d := in.dur.Swap(nil); d != nil {
		if d.sb != nil {
			d.sb.gate.Close(err)
		}
		d.gate.Close(err)
		// The shipper's kept connections (and an isolated space's helper) go now, before
		// the final checkpoint: were one the last connection to a database, its close
		// checkpoints the WAL into it.
		d.mu.Lock()
		d.shipper.Close()
		if d.sb != nil {
			d.sb.shipper.Close()
		}
		d.mu.Unlock()
	}
}

// Gate is the output gate the instance's answers go through (Kind.Durability
// DurabilityBucket), nil when its kind acknowledges at checkpoints.
func (u *Use) Gate() *gate.Gate {
	if d := u.in.durableOf(); d != nil {
		return d.answers()
	}
	return nil
}

// LogCarriesAll reports whether the space's log carries every file of its data dir as its
// last cut found them (log_skipped empty): then what the instance committed before a
// WaitDurable that returned nil is in the bucket, and a held message it acknowledged may be
// retired at once. False for a kind that acknowledges at checkpoints, before the first
// cut, and while the data dir holds a file the log does not carry (a plain file, a
// database not in WAL mode): that state is durable at checkpoints only, so its held
// messages are kept until one, as a checkpoint kind's are. Call it after WaitDurable: that
// wait's cut read the data dir after the instance's answer.
func (u *Use) LogCarriesAll() bool {
	d := u.in.durableOf()
	if d == nil {
		return false
	}
	sk := d.skipped.Load()
	return sk != nil && len(*sk) == 0
}

// WaitDurable returns once the commits the instance made before the call are in the
// space's log (the segment cut after it, and every one before, landed), at once for a
// kind that acknowledges at checkpoints; an error (gate.ErrNotDurable) within
// DurableAnswerTimeout when they could not be shipped: what they carried must not be
// acknowledged.
func (u *Use) WaitDurable(ctx context.Context) error {
	return u.in.waitDurable(ctx)
}

// WaitDurable is Use.WaitDurable for host's space, for what its instance sends outside an
// answer (a control call's messages to held connections); nil when it is not awake here
// or its kind acknowledges at checkpoints.
func (e *Engine) WaitDurable(ctx context.Context, host string) error {
	if in := e.lookup(host); in != nil {
		return in.waitDurable(ctx)
	}
	return nil
}

func (in *inst) waitDurable(ctx context.Context) error {
	d := in.durableOf()
	if d == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, DurableAnswerTimeout)
	defer cancel()
	return d.answers().Wait(ctx)
}

// DurableStatus is an awake space's log and gate, for /lchat/status and the console.
type DurableStatus struct {
	// Segments and Bytes are the segments landed in the log and their page images' bytes;
	// Folded the segments a checkpoint covered since (a new generation).
	Segments uint64 `json:"segments"`
	Bytes    uint64 `json:"bytes"`
	Folded   uint64 `json:"folded"`
	// Unproven is the bytes of the segments cut and not landed yet (the durable lag in
	// bytes); Landing how many, and LandTime how long recent ones took from cut to landed.
	Unproven int64         `json:"unproven_bytes"`
	Landing  int           `json:"landing"`
	LandTime time.Duration `json:"land_ns"`
	// Generation and NextSeq are where the log stands.
	Generation int64 `json:"generation"`
	NextSeq    int64 `json:"next_seq"`
	// Waiting and Lag: answers held at the gate now, and how long the oldest has waited
	// (the durable lag).
	Waiting int           `json:"waiting"`
	Lag     time.Duration `json:"lag_ns"`
	// WaitP50 and WaitP99 are the gate's recent waits.
	WaitP50 time.Duration `json:"wait_p50_ns"`
	WaitP99 time.Duration `json:"wait_p99_ns"`
	// Failed counts answers that got 503 because their commits did not land in time.
	Failed uint64 `json:"failed"`
	// Skipped are the files the log does not carry (checkpoints do).
	Skipped []spacestore.SkippedFile `json:"log_skipped,omitempty"`
	// Standby is the stream of a kind whose durability is standby; nil for others.
	Standby *StandbyStatus `json:"standby,omitempty"`
}

// StandbyStatus is where an awake space's stream goes (standby.go).
type StandbyStatus struct {
	// Box is the standby; empty when the space has none (NoStandby says why): its answers
	// then wait for the bucket log.
	Box       string `json:"box,omitempty"`
	NoStandby string `json:"no_standby,omitempty"`
	// Sent is the stream's last segment the standby has; Streamed the segments it took
	// since the wake, Lost how many standbys were given up.
	Sent     int64  `json:"sent_seq"`
	Streamed uint64 `json:"streamed"`
	Lost     uint64 `json:"lost"`
}

func (d *durable) status() *DurableStatus {
	st, ans := d.gate.Stats(), d.answers().Stats()
	ds := &DurableStatus{Generation: d.gen.Load(), NextSeq: d.next.Load()}
	if d.sb != nil {
		cur := d.sb.cur.Load()
		ss := &StandbyStatus{Sent: cur.sent.Load(), Streamed: d.streamed.Load(), Lost: d.standbyLost.Load()}
		if !cur.broken.Load() {
			ss.Box = cur.box
		} else if why := cur.why.Load(); why != nil {
			ss.NoStandby = *why
		}
		ds.Standby = ss
	} else if d.noStandby != "" {
		ds.Standby = &StandbyStatus{NoStandby: d.noStandby}
	}
	if sk := d.skipped.Load(); sk != nil {
		ds.Skipped = *sk
	}
	ds.Segments, ds.Bytes, ds.Folded, ds.Unproven = d.segments.Load(), d.bytes.Load(), d.folded.Load(), d.unproven.Load()
	ds.Landing, ds.LandTime = st.Landing, st.LandTime
	ds.Waiting, ds.Lag, ds.WaitP50, ds.WaitP99, ds.Failed = ans.Waiting, ans.Lag, ans.WaitP50, ans.WaitP99, ans.Failed
	return ds
}
