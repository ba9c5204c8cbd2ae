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
	"github.com/lchat/lchat-caddy/standby"
)

// Standby acknowledgements (Kind.Durability DurabilityStandby). A space of such a kind
// ships its log to the bucket as a "bucket" kind does (durable.go), about once a second
// (logEvery) with nobody waiting on it, and its answers wait instead for a second log, its
// stream: each group of commits cut into the stream's next segment and sent to the space's
// standby box (StandbyLink.Pick: the next box of its placement among the live boxes of its
// region), which answers once the segment is fsynced in its spool (package standby). A
// write is acknowledged once it is on two boxes' disks, at a LAN round trip rather than a
// bucket PUT.
//
// Never one copy: a holder whose standby does not answer (or that has none) waits, for
// that answer and every later one of the stream, for the bucket log instead (the bucket's
// gate: a shipment cut after the answer, landed), until its next checkpoint starts a new
// stream. A sealed stream (a takeover) fences the holder out, as a sealed bucket log does.
//
// A takeover (openLog) reads the holder's standby record (spacestore.StandbyRecord), seals
// the stream on the standby and takes its segments; when the stream's last segment was
// cut after the bucket log's last (Entry.BucketBefore), the stream is newer: the data dir
// is rebuilt from the bucket log up to the stream's base and the stream, and the pages in
// which that state differs from the bucket log's are appended to the bucket log (a fixup
// segment) before it is sealed, so the bucket log alone carries the state from then on.
// A standby that is neither a live member nor answers the seal may be restarting with the
// stream on its disk: the takeover waits for it while its last heartbeat is young
// (standbyGone), unless its holder marked it given up (recordGivenUp: the bucket log holds
// what the stream carried); one silent longer is a second failure, and what only the two
// dead boxes held is lost (logged).

// StandbyLink is how a holder reaches its spaces' standbys (the box wires it to the mesh).
type StandbyLink interface {
	// Pick names host's standby: a live box of its region other than this one, the same
	// for every box with the same view; ok false when there is none.
	Pick(host string) (box string, ok bool)
	// Put sends one segment of host's stream to box and returns nil once box has it on
	// disk. Errors: standby.ErrSealed (wrapped) when a takeover sealed the stream.
	Put(ctx context.Context, box, host string, e standby.Entry) error
	// Seal seals host's stream of (gen, claim) on box and returns its segments.
	Seal(ctx context.Context, box, host string, gen int64, claim spacestore.Claim) ([]standby.Entry, error)
	// Retire asks box to drop host's stream of (gen, claim): a checkpoint after it holds
	// what it carried (the space slept). handover: it slept on this box's drain, and box
	// is where it wakes next (box warms its copy of the checkpoint: Prewarm).
	Retire(ctx context.Context, box, host string, gen int64, claim spacestore.Claim, handover bool) error
	// Live reports whether box is a live member.
	Live(box string) bool
	// SilentFor reads box's heartbeat afresh and returns how long ago it was last written,
	// by the bucket's clock; beating false when box has no heartbeat at all (it left).
	SilentFor(ctx context.Context, box string) (silent time.Duration, beating bool, err error)
}

// standbyGoneAfter is how long a takeover waits for a standby that neither beats nor
// answers and holds a stream the bucket log may lack: counted from the standby's last
// heartbeat, it covers a box restarting (its spool is on disk) or a machine rebooting.
// Until then the takeover fails (the wake is retried, the space dark); after it, the
// standby counts as lost with its holder, and what only the two held is lost (logged).
const standbyGoneAfter = time.Minute

// standbyPutTimeout bounds one send of a segment to the standby: a standby that does not
// answer within it is given up for bucket proofs.
const standbyPutTimeout = 2 * time.Second

// streamer is an awake space's stream: its own shipper and the gate its answers wait on.
type streamer struct {
	link    StandbyLink
	shipper *spacestore.LogShipper // under durable.mu, as the bucket log's
	gate    *gate.Gate
	cur     atomic.Pointer[stream]
	// recMu serializes the record's writes of the landings in flight; recETag is the
	// record's ETag as this streamer last read or wrote it (read first when unknown): its
	// writes are conditioned on it.
	recMu     sync.Mutex
	recETag   string
	recETagOK bool
	// retry is the standby this streamer gave up last and when a stream may pick it again:
	// a box that did not answer (cut off, or dead and not yet counted so) is not asked at
	// each new stream, every write then waiting out standbyPutTimeout for it.
	retry standbyRetry
}

// standbyRetry is when a streamer asks a standby it gave up again: after
// standbyRetryFirst, doubling to standbyRetryMax while the box keeps failing, at once after
// it took a segment.
type standbyRetry struct {
	mu        sync.Mutex
	box       string
	until     time.Time
	wait      time.Duration
	scheduled bool // a checkpoint waits for until (a new stream)
}

const (
	standbyRetryFirst = 5 * time.Second
	standbyRetryMax   = time.Minute
)

// lost notes that box was given up at now and returns until when it is not asked again.
func (r *standbyRetry) lost(box string, now time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if box != r.box {
		r.box, r.wait = box, 0
	}
	r.wait = min(max(2*r.wait, standbyRetryFirst), standbyRetryMax)
	r.until = now.Add(r.wait)
	return r.until
}

// answered notes that box took a segment: it is asked at once from now on.
func (r *standbyRetry) answered(box string) {
	r.mu.Lock()
	if box == r.box {
		r.box, r.wait, r.until = "", 0, time.Time{}
	}
	r.mu.Unlock()
}

// waiting reports until when box is not asked, if it is not.
func (r *standbyRetry) waiting(box string, now time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.until, box == r.box && now.Before(r.until)
}

// stream is one stream of a streamer: from a wake, or from a checkpoint's new generation.
type stream struct {
	gen, baseSeq int64
	box          string // "" when there is no standby: every answer waits for the bucket
	recorded     atomic.Bool
	marked       atomic.Bool // its record is marked given up (markGivenUp)
	broken       atomic.Bool
	sent         atomic.Int64 // the last seq the standby has (it takes them in order)
	why          atomic.Pointer[string]
	recETag      string // the ETag of its record as written (under streamer.recMu)
}

func (s *stream) breakWith(why string) bool {
	s.why.Store(&why)
	return s.broken.CompareAndSwap(false, true)
}

// newStreamer starts in's stream on base (a copy the streamer owns) at the bucket log's
// seq baseSeq of generation gen.
func (e *Engine) newStreamer(in *inst, d *durable, base *spacestore.LogBase, gen, baseSeq int64) *streamer {
	sb := &streamer{link: e.cfg.Standby}
	sb.shipper = spacestore.NewLogShipper(in.dataDir, in.syncer.PageReader, base, gen, 1, d.claim)
	sb.cur.Store(e.newStream(in, sb, gen, baseSeq))
	sb.gate = gate.New(gate.Config{
		Cut: func(ctx context.Context) (gate.Land, error) { return e.cutStream(ctx, in, d, sb) },
		// One segment is on its way at a time, unlike the bucket log's pipeline: the standby
		// takes a stream's segments in turn and syncs each (standby.Spool.Put), so segments
		// sent at once only sync one after another, and the writes that arrive while one
		// lands are better grouped into the next. Measured side by side under 64 writers
		// (docs/durability-figures.md): 0.06 segments a write against 0.09-0.10 with four on
		// their way, and more throughput.
		Depth:  1,
		Now:    e.now,
		Logger: in.logger(),
	})
	return sb
}

func (e *Engine) newStream(in *inst, sb *streamer, gen, baseSeq int64) *stream {
	st := &stream{gen: gen, baseSeq: baseSeq}
	prev := sb.cur.Load()
	box, ok := sb.link.Pick(in.host)
	if !ok {
		st.breakWith("no other live box in the space's region")
		if prev == nil || prev.box != "" {
			// Said once per change, not at every checkpoint of a fleet of one.
			in.logger().Info("no standby for the space: its answers wait for the bucket log", zap.Int64("generation", gen))
		}
		return st
	}
	if until, wait := sb.retry.waiting(box, e.now()); wait {
		st.breakWith(fmt.Sprintf("the standby %s did not answer; it is asked again from %s", box, until.UTC().Format(time.RFC3339)))
		return st
	}
	st.box = box
	if prev != nil && prev.box != box {
		in.logger().Info("standby for the space", zap.String("standby", box), zap.Int64("generation", gen))
	}
	return st
}

// restart, after a checkpoint started generation gen (d.mu held), starts a new stream on
// base: a standby given up comes back, or another is picked.
func (e *Engine) restartStream(in *inst, d *durable, sb *streamer, base *spacestore.LogBase, gen int64) {
	sb.shipper.Close()
	sb.shipper = spacestore.NewLogShipper(in.dataDir, in.syncer.PageReader, base, gen, 1, d.claim)
	sb.cur.Store(e.newStream(in, sb, gen, 0))
}

// cutStream is the stream gate's Cut: the next segment of the stream, cut under d.mu with
// the bucket log's cuts (so BucketBefore orders the two), and its Land: sent to the
// standby; on bucket proofs when there is none.
func (e *Engine) cutStream(ctx context.Context, in *inst, d *durable, sb *streamer) (gate.Land, error) {
	if e.life.Fenced() {
		return nil, errFencedNoWrite
	}
	if err := e.settleUnsure(in, d); err != nil {
		return nil, err
	}
	st := sb.cur.Load()
	if st.broken.Load() {
		return func(ctx context.Context) error { return e.bucketProof(ctx, d) }, nil
	}
	d.mu.Lock()
	if d.unsure.Load() { // as in cutSegment: a checkpoint ran meanwhile, its write unsure
		d.mu.Unlock()
		return nil, e.settleUnsure(in, d)
	}
	st = sb.cur.Load() // a checkpoint may have started a new stream
	seg, err := sb.shipper.Next(ctx, e.now())
	before := d.shipper.NextSeq() - 1
	d.mu.Unlock()
	if errors.Is(err, spacestore.ErrSegmentTooLarge) {
		e.checkpointForTheLog(in)
		return nil, err
	}
	if err != nil || seg == nil {
		return nil, err
	}
	data, err := spacestore.EncodeSegment(seg)
	if err != nil {
		return nil, err
	}
	entry := standby.Entry{BucketBefore: before, Data: data}
	return func(ctx context.Context) error {
		if d.gen.Load() > st.gen {
			return nil // a checkpoint covers it (appendSegment says why)
		}
		if st.sent.Load() >= seg.Seq {
			return nil
		}
		if !st.broken.Load() {
			err := e.sendToStandby(ctx, in, d, st, seg.Seq, entry)
			if err == nil {
				return nil
			}
			if errors.Is(err, gate.ErrFenced) {
				return err
			}
		}
		return e.bucketProof(ctx, d)
	}, nil
}

// sendToStandby lands one segment of st on its standby: the record first, for the first
// segment. An error that is not ErrFenced has given the standby up (st broken).
func (e *Engine) sendToStandby(ctx context.Context, in *inst, d *durable, st *stream, seq int64, entry standby.Entry) error {
	log := in.logger()
	if err := e.recordStream(ctx, in, d, st); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, standbyPutTimeout)
	err := e.cfg.Standby.Put(pctx, st.box, in.host, entry)
	cancel()
	switch {
	case err == nil:
		d.sb.retry.answered(st.box)
		for prev := st.sent.Load(); prev < seq; prev = st.sent.Load() {
			if st.sent.CompareAndSwap(prev, seq) {
				break
			}
		}
		e.noteStreamed(d)
		return nil
	case errors.Is(err, standby.ErrSealed):
		log.Error("stream sealed by a takeover: this instance acknowledges nothing more", zap.String("standby", st.box))
		safego.Go(&e.wg, e.log, "fence out", func() {
			in.op.Lock()
			defer in.op.Unlock()
			if in.durableOf() == d {
				e.fenceOut(in)
			}
		})
		return fmt.Errorf("%w: %w", gate.ErrFenced, err)
	}
	e.giveUpStandby(in, d, st, err.Error())
	return err
}

// giveUpStandby breaks st (its later answers wait for the bucket log), marks its record
// given up in the background once the bucket log holds what it carried (recordGivenUp),
// and schedules the checkpoint that starts the next stream. It does so once per stream.
func (e *Engine) giveUpStandby(in *inst, d *durable, st *stream, why string) {
	if !st.breakWith(why) {
		return
	}
	e.noteStandbyLost(d)
	e.recordGivenUp(in, d, st)
	until := d.sb.retry.lost(st.box, e.now())
	in.logger().Warn("standby lost: the space's answers wait for the bucket log until its next checkpoint",
		zap.String("standby", st.box), zap.Time("asked_again_from", until), zap.String("why", why))
	e.checkpointForAStream(in, d.sb, until)
}

// checkpointForAStream checkpoints in at until (once, however many streams broke
// meanwhile): its new generation starts a new stream, to the same standby or another,
// sooner than the replication class's next checkpoint would.
func (e *Engine) checkpointForAStream(in *inst, sb *streamer, until time.Time) {
	sb.retry.mu.Lock()
	if sb.retry.scheduled {
		sb.retry.mu.Unlock()
		return
	}
	sb.retry.scheduled = true
	sb.retry.mu.Unlock()
	safego.Go(&e.wg, e.log, "checkpoint for a new stream", func() {
		defer func() {
			sb.retry.mu.Lock()
			sb.retry.scheduled = false
			sb.retry.mu.Unlock()
		}()
		t := time.NewTimer(max(0, until.Sub(e.now())))
		defer t.Stop()
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		e.syncNow(e.ctx, in)
	})
}

// recordStream writes st's record once, before any of its segments' landings returns:
// the landings in flight take turns (sb.recMu), the first writes it. An error has given
// the standby up (st broken).
func (e *Engine) recordStream(ctx context.Context, in *inst, d *durable, st *stream) error {
	if st.recorded.Load() {
		return nil
	}
	d.sb.recMu.Lock()
	defer d.sb.recMu.Unlock()
	if st.recorded.Load() {
		return nil
	}
	rec := spacestore.StandbyRecord{Gen: st.gen, BaseSeq: st.baseSeq, Claim: d.claim, Box: st.box}
	rctx, cancel := context.WithTimeout(ctx, segmentTimeout)
	err := e.writeRecord(rctx, in, d.sb, rec)
	cancel()
	if err != nil {
		if st.breakWith("the standby record could not be written: " + err.Error()) {
			in.logger().Warn("standby record not written: the space's answers wait for the bucket log", zap.Error(err))
		}
		return err
	}
	st.recETag = d.sb.recETag
	st.recorded.Store(true)
	return nil
}

// recordGivenUp, once st's standby was given up, writes st's record again marked given up
// (markGivenUp) in the background, until it is so marked or the stream, the instance or
// the gate ends (a fence, a stop: the record then stays as it is). Until then a takeover
// that finds the standby silent waits for it (standbyGone).
func (e *Engine) recordGivenUp(in *inst, d *durable, st *stream) {
	if !st.recorded.Load() {
		return // the record names an older stream, or none: nothing to mark
	}
	safego.Go(&e.wg, e.log, "record the standby given up", func() {
		for in.durableOf() == d && d.sb.cur.Load() == st {
			err := e.markGivenUp(e.ctx, in, d, st)
			if err == nil || e.ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
				return
			}
		}
	})
}

// markGivenUp writes st's record (its standby given up, st broken) again marked given up
// (StandbyRecord.GivenUp) once a bucket proof cut after the break has landed: every segment
// the standby took was cut before the break (a landing that finds the stream broken proves
// in the bucket instead), so the bucket log then holds everything the stream carried, and a
// takeover that cannot reach the standby (dead too, restarting, or gone from the fleet)
// need not wait for it. The write is conditioned on st's own record: a later record (a
// newer stream, a newer holder) stands. nil when the record is so marked, or names a later
// stream; an error of the proof (DeadlineExceeded: the bucket did not answer in time) or
// of the write otherwise.
func (e *Engine) markGivenUp(ctx context.Context, in *inst, d *durable, st *stream) error {
	if !st.recorded.Load() || st.marked.Load() {
		return nil
	}
	if err := e.bucketProof(ctx, d); err != nil {
		return err
	}
	d.sb.recMu.Lock()
	defer d.sb.recMu.Unlock()
	switch {
	case st.marked.Load():
		return nil
	case d.sb.cur.Load() != st:
		return nil // a checkpoint after st started a newer stream: st's record is obsolete
	case d.sb.recETag != st.recETag:
		return errors.New("the standby record changed since the stream wrote it")
	}
	rec := spacestore.StandbyRecord{Gen: st.gen, BaseSeq: st.baseSeq, Claim: d.claim, Box: st.box, GivenUp: true}
	wctx, cancel := context.WithTimeout(ctx, segmentTimeout)
	etag, err := spacestore.WriteStandbyRecord(wctx, e.cfg.Bucket, in.host, rec, st.recETag)
	cancel()
	if err != nil {
		d.sb.recETagOK = false
		in.logger().Info("the standby record was not marked given up: a takeover that cannot reach the standby waits for it",
			zap.String("standby", st.box), zap.Error(err))
		return err
	}
	d.sb.recETag, st.recETag = etag, etag
	st.marked.Store(true)
	in.logger().Info("standby record marked given up: the bucket log holds what its stream carried", zap.String("standby", st.box))
	return nil
}

// ReleaseStandby is a holder's answer to its standby box leaving the fleet cleanly (a
// drain, a restart's SIGTERM): box asks to be released from host's stream of (gen, claim)
// before it deletes its heartbeat. The stream is given up (its later answers wait for the
// bucket log) and its record marked given up (markGivenUp) before ReleaseStandby returns
// nil, so a takeover that finds box gone from the mesh need not wait for it. nil too when
// a checkpoint after the stream holds what it carried. An error wrapping
// standby.ErrNotCurrent when this box does not hold that stream (the space moved, slept
// without a checkpoint after it, or streams to another box); any other error (the bucket
// out of reach: the proof timed out) leaves the record unmarked, and a takeover that
// cannot reach box then waits for it (standbyGone).
func (e *Engine) ReleaseStandby(ctx context.Context, host, box string, gen int64, claim spacestore.Claim) error {
	in := e.lookup(host)
	if in == nil {
		return fmt.Errorf("%w: %s is not awake here", standby.ErrNotCurrent, host)
	}
	d := in.durableOf()
	switch {
	case d == nil || d.sb == nil || !spacestore.SameClaim(d.claim, claim):
		if in.checkpointedPast(gen) {
			return nil
		}
		return fmt.Errorf("%w: this box does not hold %s under that claim", standby.ErrNotCurrent, host)
	case d.gen.Load() > gen:
		return nil
	}
	st := d.sb.cur.Load()
	if st.gen != gen || st.box != box {
		return fmt.Errorf("%w: %s streams generation %d to %q", standby.ErrNotCurrent, host, st.gen, st.box)
	}
	e.giveUpStandby(in, d, st, "the standby "+box+" is leaving the fleet")
	return e.markGivenUp(ctx, in, d, st)
}

// writeRecord writes the standby record, conditioned on the one sb last read or wrote
// (spacestore.WriteStandbyRecord says why): when it changed since (a paused earlier
// holder's late write landed), it is read again and written over.
func (e *Engine) writeRecord(ctx context.Context, in *inst, sb *streamer, rec spacestore.StandbyRecord) error {
	for try := 0; ; try++ {
		if !sb.recETagOK {
			_, etag, err := spacestore.ReadStandbyRecord(ctx, e.cfg.Bucket, in.host)
			if err != nil {
				return err
			}
			sb.recETag, sb.recETagOK = etag, true
		}
		etag, err := spacestore.WriteStandbyRecord(ctx, e.cfg.Bucket, in.host, rec, sb.recETag)
		if err == nil {
			sb.recETag = etag
			return nil
		}
		sb.recETagOK = false
		if !errors.Is(err, spacestore.ErrStandbyRecordMoved) || try == 2 {
			return err
		}
	}
}

// bucketProof returns once what the instance committed before the call is in the bucket
// log: the proof an answer takes when its stream has no standby.
func (e *Engine) bucketProof(ctx context.Context, d *durable) error {
	ctx, cancel := context.WithTimeout(ctx, DurableAnswerTimeout)
	defer cancel()
	return d.gate.Wait(ctx)
}

// takeStream, for a takeover of host's log of gen (lg, read and not sealed yet) under
// claim, seals the previous holder's stream on its standby and returns it when it is newer
// than the bucket log, with the record naming its base; nil when there is none to take.
// An error means the stream could be there and was not read: the wake must not go on
// without it.
func (e *Engine) takeStream(ctx context.Context, in *inst, gen int64, claim spacestore.Claim, lg *spacestore.Log) (*spacestore.StandbyRecord, []*spacestore.Segment, error) {
	if e.cfg.Standby == nil {
		return nil, nil, nil
	}
	log := in.logger()
	rec, _, err := spacestore.ReadStandbyRecord(ctx, e.cfg.Bucket, in.host)
	if err != nil || rec == nil {
		return nil, nil, err
	}
	// Each way of not taking the stream is logged: a takeover that leaves a stream behind
	// must say why, or a lost write could not be traced to it.
	skip := func(why string) (*spacestore.StandbyRecord, []*spacestore.Segment, error) {
		log.Info("not taking the standby's stream", zap.String("why", why), zap.String("standby", rec.Box),
			zap.Int64("stream_generation", rec.Gen), zap.Int64("generation", gen), zap.Int64("base_seq", rec.BaseSeq),
			zap.String("holder", rec.Claim.Holder))
		return nil, nil, nil
	}
	switch {
	case rec.Gen < gen:
		// The usual case of a space that slept or checkpointed since: not worth a line.
		log.Debug("not taking the standby's stream: a checkpoint after it covers it", zap.Int64("stream_generation", rec.Gen),
			zap.Int64("generation", gen))
		return nil, nil, nil
	case rec.Gen > gen:
		return skip("a stream of a newer generation than the checkpoint restored")
	case spacestore.SameClaim(rec.Claim, claim):
		return nil, nil, nil // ours
	case rec.BaseSeq > 0 && (lg.Sealer == nil || !spacestore.SameClaim(*lg.Sealer, rec.Claim)):
		return skip("a later holder sealed the log since: the stream is older")
	case rec.BaseSeq == 0 && lg.Sealer != nil:
		return skip("the log was sealed since the stream's checkpoint: the stream is older")
	case rec.GivenUp:
		// The holder proved in the bucket log every write the stream carried: there is
		// nothing to take, and the standby, perhaps dead with it, is not waited for.
		return skip("the holder gave the standby up, and the bucket log holds what the stream carried")
	case lg.Last < rec.BaseSeq:
		return nil, nil, fmt.Errorf("the stream builds on segment %d of the log, which ends at %d", rec.BaseSeq, lg.Last)
	}
	// A standby that is not a live member may still answer: its heartbeat stale because
	// its own bucket link failed (fenced), it keeps its spool. Its stream is taken if it
	// answers the seal; only a standby that cannot be reached and is not live is a second
	// failure.
	live := e.cfg.Standby.Live(rec.Box)
	sctx := ctx
	if !live {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(ctx, standbyPutTimeout)
		defer cancel()
	}
	entries, err := e.cfg.Standby.Seal(sctx, rec.Box, in.host, gen, rec.Claim)
	if err != nil && !live {
		return e.standbyGone(ctx, in, rec, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("sealing the stream on the standby %s: %w", rec.Box, err)
	}
	if len(entries) == 0 {
		return skip("the standby holds no segment of the stream")
	}
	segs := make([]*spacestore.Segment, len(entries))
	for i, en := range entries {
		seg, err := spacestore.DecodeSegment(en.Data)
		if err != nil {
			return nil, nil, fmt.Errorf("the standby's stream: %w", err)
		}
		if seg.Gen != gen || seg.Seq != int64(i+1) || seg.Seal || !spacestore.SameClaim(seg.Claim, rec.Claim) {
			return nil, nil, fmt.Errorf("the standby's stream: segment %d is %d of generation %d", i+1, seg.Seq, seg.Gen)
		}
		segs[i] = seg
	}
	lastB := int64(0) // the bucket log's last segment of the stream's holder
	for _, s := range lg.Segments {
		if spacestore.SameClaim(s.Claim, rec.Claim) {
			lastB = max(lastB, s.Seq)
		}
	}
	if last := entries[len(entries)-1]; last.BucketBefore < lastB {
		// The bucket log was cut after the stream's last segment: it is the newer state.
		return skip(fmt.Sprintf("the bucket log (segment %d of the holder) was cut after the stream's last segment (%d segments, after bucket segment %d)",
			lastB, len(entries), last.BucketBefore))
	}
	return rec, segs, nil
}

// standbyGone decides a takeover whose standby is not a live member and did not answer
// the seal (sealErr): while its last heartbeat is younger than standbyGoneAfter it may be
// restarting with the stream on its disk, and the takeover fails (ErrStandbySilent, the
// wake retried later); once older, the takeover goes on from the bucket and what only the
// standby and the dead holder held is lost, logged as such. A standby with no heartbeat at
// all left: a clean exit deletes it (a restart's, a drain's) and keeps the spool, so it is
// waited for the same, counted from when this box first found it so (absentStandbys).
func (e *Engine) standbyGone(ctx context.Context, in *inst, rec *spacestore.StandbyRecord, sealErr error) (*spacestore.StandbyRecord, []*spacestore.Segment, error) {
	silent, beating, err := e.cfg.Standby.SilentFor(ctx, rec.Box)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s does not answer the seal (%v), and its heartbeat could not be read: %w", ErrStandbySilent, rec.Box, sealErr, err)
	}
	if beating {
		e.absent.back(rec.Box)
	} else {
		silent = e.absent.since(rec.Box, e.now())
	}
	if silent < standbyGoneAfter {
		how := fmt.Sprintf("beat %v ago", silent.Round(time.Millisecond))
		if !beating {
			how = fmt.Sprintf("has no heartbeat (it left), found so %v ago", silent.Round(time.Millisecond))
		}
		return nil, nil, fmt.Errorf("%w: %s does not answer the seal (%v) and %s; a takeover waits for it %v",
			ErrStandbySilent, rec.Box, sealErr, how, standbyGoneAfter)
	}
	in.logger().Error("the space's standby is gone with its holder: writes only the two held are lost",
		zap.String("standby", rec.Box), zap.String("holder", rec.Claim.Holder), zap.Bool("beating", beating),
		zap.Duration("silent", silent), zap.Error(sealErr))
	return nil, nil, nil
}

// absentStandbys is when a box first found each standby without a heartbeat: a heartbeat
// deleted says the box left, not when, so the wait for it starts at the first look.
type absentStandbys struct {
	mu    sync.Mutex
	first map[string]time.Time
}

// since returns how long ago box was first found without a heartbeat (0 the first time).
func (a *absentStandbys) since(box string, now time.Time) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.first == nil {
		a.first = make(map[string]time.Time)
	}
	for b, t := range a.first {
		if now.Sub(t) > absentForgotten {
			delete(a.first, b) // long settled: a later absence is a new one
		}
	}
	t, ok := a.first[box]
	if !ok {
		t = now
		a.first[box] = t
	}
	return now.Sub(t)
}

// back forgets box's absence: it beats again.
func (a *absentStandbys) back(box string) {
	a.mu.Lock()
	delete(a.first, box)
	a.mu.Unlock()
}

// absentForgotten is how long a standby's absence is remembered: far past standbyGoneAfter,
// so the wait it bounds is over long before.
const absentForgotten = time.Hour

// ErrStandbySilent is why a takeover waits: the holder's standby may hold writes the bucket
// log lacks, and neither beats nor answers, for less than standbyGoneAfter.
var ErrStandbySilent = errors.New("waiting for the space's standby")

// applyStream rebuilds the data dir from the bucket log up to the stream's base and the
// stream (base brought in step), and appends to the bucket log, at its end, the pages in
// which that state differs from the log's, under the stream's claim: the log then carries
// the stream. lg is extended with it.
func (e *Engine) applyStream(ctx context.Context, in *inst, base *spacestore.LogBase, lg *spacestore.Log, rec *spacestore.StandbyRecord, stream []*spacestore.Segment) error {
	pages := make(map[string]map[uint32]bool)
	var upTo []*spacestore.Segment
	for _, s := range lg.Segments {
		if s.Seq <= rec.BaseSeq {
			upTo = append(upTo, s)
		} else if err := spacestore.SegmentPages(s, pages); err != nil {
			return err
		}
	}
	for _, s := range stream {
		if err := spacestore.SegmentPages(s, pages); err != nil {
			return err
		}
	}
	if err := in.syncer.ApplySegments(base, upTo); err != nil {
		return fmt.Errorf("applying the log: %w", err)
	}
	if err := in.syncer.ApplySegments(base, stream); err != nil {
		return fmt.Errorf("applying the stream: %w", err)
	}
	fix, err := spacestore.FixupSegment(in.dataDir, pages, lg.Gen, lg.Last+1, rec.Claim, e.now())
	if err != nil {
		return err
	}
	if len(fix.DBs) > 0 {
		actx, cancel := context.WithTimeout(ctx, segmentTimeout)
		err := spacestore.AppendSegment(actx, e.cfg.Bucket, in.host, fix)
		cancel()
		if err != nil {
			return fmt.Errorf("appending the stream to the log: %w", err)
		}
		lg.Segments = append(lg.Segments, fix)
		lg.Last = fix.Seq
	}
	in.logger().Info("took the standby's stream", zap.String("standby", rec.Box), zap.Int("segments", len(stream)),
		zap.Int64("log_seq", lg.Last))
	return nil
}

// Logs reports whether a kind of durability d ships its log to the bucket (bucket and
// standby do).
func (d Durability) Logs() bool { return d == DurabilityBucket || d == DurabilityStandby }

// TakeOver wakes sp here in place of holder (at incarnation), which the caller found dead
// before its heartbeat says so (its process gone: its address refuses connections), and
// returns a Use as Acquire does. Only a space whose kind's durability is standby is taken
// over early: the wake seals the holder's stream and its bucket log before the instance
// starts, so were the holder alive after all it could acknowledge nothing more; a space of
// another kind could go on acknowledging writes on the old holder, and waits for the
// holder's heartbeat to die (ErrNotStandby).
func (e *Engine) TakeOver(ctx context.Context, sp Space, holder, incarnation string) (*Use, error) {
	kind, ok := e.kind(sp.Kind)
	if !ok {
		return nil, ErrUnknownKind
	}
	if kind.Durability != DurabilityStandby {
		return nil, ErrNotStandby
	}
	if !validHost(sp.Host) {
		return nil, fmt.Errorf("invalid host %q", sp.Host)
	}
	in := e.get(sp.Host)
	gone := [2]string{holder, incarnation}
	in.mu.Lock()
	in.goneHolder = gone
	in.mu.Unlock()
	u, err := e.acquire(ctx, sp, kind, in)
	var held *LeaseHeldError
	if !errors.As(err, &held) {
		return u, err
	}
	// A wake that started before the verdict (a request that reached this box as the
	// holder died) did not count the holder dead, and this call joined it: its refusal is
	// not the verdict's. Once more, unless that wake used the verdict.
	in.mu.Lock()
	unused := in.goneHolder == gone
	in.mu.Unlock()
	if !unused {
		return u, err
	}
	return e.acquire(ctx, sp, kind, in)
}

// ErrNotStandby is TakeOver's refusal of a space whose kind's durability is not standby.
var ErrNotStandby = errors.New("only a space of standby durability is taken over before its holder's heartbeat dies")

// streamToRetire is in's current stream and its claim, for retireStream once the final
// checkpoint after it has landed; nil when there is none the standby has.
func (in *inst) streamToRetire() (*stream, spacestore.Claim) {
	d := in.durableOf()
	if d == nil || d.sb == nil {
		return nil, spacestore.Claim{}
	}
	st := d.sb.cur.Load()
	if st.box == "" || !st.recorded.Load() {
		return nil, spacestore.Claim{}
	}
	return st, d.claim
}

// checkpointedPast reports whether in's manifest is of a generation after gen: a checkpoint
// after the stream of gen holds what it carried. A stop that wrote nothing (a fenced box
// stops its spaces without writing) leaves the manifest where it was, and the stream is the
// only copy of what was acknowledged since: it is not retired.
func (in *inst) checkpointedPast(gen int64) bool {
	if in.syncer == nil {
		return false
	}
	m, _ := in.syncer.Manifest()
	return m != nil && m.Generation > gen
}

// retireStream, after a checkpoint that followed st (the space slept), asks its standby to
// drop it, in the background: best effort, the standby keeps it otherwise (a later stream
// of the space replaces it, and a takeover never takes it: its generation is older).
// handover: the space slept on this box's drain; its standby warms the checkpoint. A
// handover is sent before the stop returns, under the stop's ctx (the drain's), since the
// box exits once its drain is done.
func (e *Engine) retireStream(ctx context.Context, in *inst, st *stream, claim spacestore.Claim, handover bool) {
	retire := func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, standbyPutTimeout)
		defer cancel()
		if err := e.cfg.Standby.Retire(ctx, st.box, in.host, st.gen, claim, handover); err != nil {
			in.logger().Info("the standby keeps the slept space's stream", zap.String("standby", st.box),
				zap.Bool("handover", handover), zap.Error(err))
		}
	}
	if handover {
		retire(ctx)
		return
	}
	safego.Go(&e.wg, e.log, "retire the stream", func() { retire(e.ctx) })
}
