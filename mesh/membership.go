package mesh

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket"

	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/lifecycle"
)

// Membership defaults.
const (
	DefaultBeat      = 15 * time.Second
	DefaultDeadAfter = 45 * time.Second
)

// MembershipConfig configures a Membership.
type MembershipConfig struct {
	// Self is this box's SELF URL (normalized with ParseSelf). Required.
	Self string
	// Region is this box's region label. Optional.
	Region string
	// Domains are the mesh domains this box covers.
	Domains []string
	// Version is this box's software version, advertised in the heartbeat.
	Version string
	// Address is this box's public address, advertised in the heartbeat. Optional.
	Address string
	// Bucket names this box's bucket (no credentials), advertised in the heartbeat.
	Bucket string
	// Incarnation identifies this process. Default: 16 random bytes, hex.
	Incarnation string
	// Beat is the heartbeat interval. Default: 15s.
	Beat time.Duration
	// DeadAfter is the heartbeat age after which a member is dead. Default: 45s.
	DeadAfter time.Duration
	// FenceMargin is how long before DeadAfter this box fences itself: it fences once
	// its last successful heartbeat write was sent more than DeadAfter-FenceMargin ago.
	// The margin must cover the time it takes to stop serving plus the bucket's clock
	// granularity (S3 LastModified and Date have whole seconds, so a peer may judge a
	// heartbeat dead up to a second early). DeadAfter-FenceMargin must exceed Beat.
	// Default: DeadAfter/3.
	FenceMargin time.Duration
	// OpTimeout bounds each bucket request. Default: Beat.
	OpTimeout time.Duration
	// Lifecycle is the box's lifecycle, which the membership moves into and out of its
	// fence (lifecycle.Machine.Fence, from the membership goroutine: the machine's
	// OnFence observers hear it) and reads for the draining flag of its heartbeat. A box
	// starts fenced until its first successful heartbeat write. Default: its own.
	Lifecycle *lifecycle.Machine
	// Logger receives membership logs. Default: a no-op logger.
	Logger *zap.Logger
	// Load measures this box's memory (its warm set, budget and awake spaces), asked at
	// the start of every beat; what the heartbeat carries follows it by PublishLoad's
	// steps. Nil: the heartbeat carries no load.
	Load func() Load
	// WallClock is this box's wall clock. Default: time.Now. Tests set one that is off
	// by minutes to show that nothing depends on the boxes' clocks agreeing (clock.go).
	WallClock func() time.Time
}

// MembershipStats counts membership work; every field only grows.
type MembershipStats struct {
	Beats          int64 `json:"beats"`
	Puts           int64 `json:"puts"`
	PutErrors      int64 `json:"put_errors"`
	Lists          int64 `json:"lists"`
	ListErrors     int64 `json:"list_errors"`
	Gets           int64 `json:"gets"`
	GetErrors      int64 `json:"get_errors"`
	SkippedBeats   int64 `json:"skipped_beats"`
	Fences         int64 `json:"fences"`
	ClockFallbacks int64 `json:"clock_fallbacks"`
	DuplicateSelf  int64 `json:"duplicate_self"`
}

// membershipCounters count the heartbeat writes and the fences; the reads are counted
// by the reader (readCounters).
type membershipCounters struct {
	beats, puts, putErrors, skipped, fences, duplicateSelf atomic.Int64
}

// Membership keeps this box's heartbeat in the bucket and the view of live members.
//
// Each beat is one PUT of the heartbeat and one LIST of MembersPrefix. Liveness is judged
// by the bucket's clock: a heartbeat's LastModified against the listing's Now (the S3
// Date header). Peer bodies (region, domains, incarnation) need a GET each, so they are
// cached by ETag and fetched again only when the ETag changes. Since a process rewrites
// a byte-identical body on every beat (it changes once, when the box starts draining, and
// that new content gets a new ETag, so every peer reads it at its next listing), stores whose ETag is a content hash (S3 for
// single-part unencrypted puts, versitygw, the file bucket) keep the ETag stable and the
// steady state costs no GETs at all; a store with per-write ETags (SSE-KMS, say) costs
// one GET per live peer per beat instead, still independent of the number of spaces.
//
// Failures are soft: a failed LIST keeps the last view, a failed PUT is counted and
// logged, and when PUTs keep failing the box fences itself (see MembershipConfig).
//
// A drain is MarkDraining, then the spaces' checkpoints and lease releases, then Leave;
// MarkDraining says why the heartbeat is not deleted first.
type Membership struct {
	cfg MembershipConfig
	// b is where this box writes its heartbeat; reader reads everyone's from it.
	b          bucket.Bucket
	reader     *memberReader
	logger     *zap.Logger
	key        string
	fenceAfter time.Duration
	stats      membershipCounters

	// body is the heartbeat body; MarkDraining replaces it once, before it asks the loop
	// for a beat, so every beat that starts after that writes the draining body. A beat
	// replaces it when the published load moves (PublishLoad).
	body atomic.Pointer[[]byte]
	// bodyMu orders the writers of body and load, so a beat's new load never brings back
	// the body of before the drain.
	bodyMu sync.Mutex
	// load is the load the body carries.
	load atomic.Pointer[Load]
	// life is the box's lifecycle: fenced (moved by the loop only) and draining.
	life *lifecycle.Machine
	// kick carries MarkDraining's requests for a beat now; the loop answers each on the
	// channel it sent, with the outcome of the heartbeat write of a beat that started
	// after the request arrived.
	kick chan chan bool

	mu sync.Mutex
	// view is the live members as of the last successful listing, sorted by Self.
	view []Member
	// viewAt is the local (monotonic) time the view's listing returned.
	viewAt time.Time
	// clock estimates the bucket's time (BucketNow); a listing from a store that reports
	// no clock leaves the last measured offset.
	clock bucketClock
	// placement follows view: every writer of view sets it under mu, so its generation
	// moves exactly when placement changes (see Placement).
	placement Placement
	// lastPutSent is when the last successful heartbeat write was sent.
	lastPutSent time.Time
	// lastPutETag is the ETag the store returned for it.
	lastPutETag string

	runMu   sync.Mutex
	started bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// NewMembership checks cfg, fills in defaults and returns a Membership that has not
// started yet.
func NewMembership(b bucket.Bucket, cfg MembershipConfig) (*Membership, error) {
	if b == nil {
		return nil, errors.New("membership: no bucket")
	}
	self, err := ParseSelf(cfg.Self)
	if err != nil {
		return nil, fmt.Errorf("membership self: %v", err)
	}
	cfg.Self = self
	if cfg.Beat <= 0 {
		cfg.Beat = DefaultBeat
	}
	if cfg.DeadAfter <= 0 {
		cfg.DeadAfter = DefaultDeadAfter
	}
	if cfg.DeadAfter <= cfg.Beat {
		return nil, fmt.Errorf("membership: dead_after %s must exceed beat %s", cfg.DeadAfter, cfg.Beat)
	}
	if cfg.FenceMargin <= 0 {
		cfg.FenceMargin = cfg.DeadAfter / 3
	}
	fenceAfter := cfg.DeadAfter - cfg.FenceMargin
	if fenceAfter <= cfg.Beat {
		return nil, fmt.Errorf("membership: dead_after %s minus fence margin %s must exceed beat %s, or a healthy box would fence itself",
			cfg.DeadAfter, cfg.FenceMargin, cfg.Beat)
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = cfg.Beat
	}
	if cfg.Incarnation == "" {
		var r [16]byte
		if _, err := rand.Read(r[:]); err != nil {
			return nil, fmt.Errorf("membership: generating incarnation: %v", err)
		}
		cfg.Incarnation = hex.EncodeToString(r[:])
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Lifecycle == nil {
		cfg.Lifecycle = lifecycle.New()
	}
	m := &Membership{
		life:       cfg.Lifecycle,
		cfg:        cfg,
		b:          b,
		reader:     newMemberReader(b, cfg.DeadAfter, cfg.OpTimeout, cfg.Logger),
		logger:     cfg.Logger,
		key:        HeartbeatKey(self),
		fenceAfter: fenceAfter,
		kick:       make(chan chan bool),
	}
	m.load.Store(new(Load))
	if err := m.encodeBody(nil); err != nil {
		return nil, err
	}
	return m, nil
}

// heartbeat is this box's heartbeat body.
func (m *Membership) heartbeat(draining bool) Heartbeat {
	return Heartbeat{Region: m.cfg.Region, Domains: m.cfg.Domains, Incarnation: m.cfg.Incarnation,
		Version: m.cfg.Version, Address: m.cfg.Address, Bucket: m.cfg.Bucket, Draining: draining, Load: *m.load.Load()}
}

// encodeBody sets the body that every beat from now on writes, with the lifecycle's
// draining flag and, when load is set, that load.
func (m *Membership) encodeBody(load *Load) error {
	m.bodyMu.Lock()
	defer m.bodyMu.Unlock()
	if load != nil {
		m.load.Store(load)
	}
	body, err := encodeHeartbeat(m.heartbeat(m.life.Draining()))
	if err != nil {
		return fmt.Errorf("membership: encoding heartbeat: %v", err)
	}
	m.body.Store(&body)
	return nil
}

// measureLoad asks the box for its load and, when it moved by a step, sets the body that
// carries it (PublishLoad).
func (m *Membership) measureLoad() {
	if m.cfg.Load == nil {
		return
	}
	measured := m.cfg.Load()
	if pub := PublishLoad(*m.load.Load(), measured); pub != *m.load.Load() {
		if err := m.encodeBody(&pub); err != nil {
			m.logger.Error("publishing load", zap.Error(err))
		}
	}
}

// PublishedLoad is the load this box's heartbeat carries now.
func (m *Membership) PublishedLoad() Load { return *m.load.Load() }

// Config returns the effective configuration, defaults filled in.
func (m *Membership) Config() MembershipConfig { return m.cfg }

// FenceAfter is DeadAfter minus FenceMargin: the age of the last successful heartbeat
// write (since it was sent) at which this box fences itself.
func (m *Membership) FenceAfter() time.Duration { return m.fenceAfter }

// Start runs the first beat synchronously, so the view is populated when it returns
// (a failed first beat is logged and counted, not returned), then beats every Beat until
// ctx ends or Close or Leave is called. Start may be called once.
func (m *Membership) Start(ctx context.Context) error {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	if m.started {
		return errors.New("membership already started")
	}
	m.started = true
	ctx, m.cancel = context.WithCancel(ctx)
	m.done = make(chan struct{})
	fenceTimer := time.NewTimer(time.Hour)
	fenceTimer.Stop()
	if sent, ok := m.putHeartbeat(ctx); ok {
		m.notePut(sent, fenceTimer)
	}
	m.refresh(ctx)
	go m.loop(ctx, fenceTimer)
	return nil
}

// loop is the single writer of the fence state after Start.
func (m *Membership) loop(ctx context.Context, fenceTimer *time.Timer) {
	defer close(m.done)
	safego.Run(m.logger, "membership loop", func() { m.runLoop(ctx, fenceTimer) })
}

func (m *Membership) runLoop(ctx context.Context, fenceTimer *time.Timer) {
	defer fenceTimer.Stop()
	ticker := time.NewTicker(m.cfg.Beat)
	defer ticker.Stop()

	// One beat runs at a time; it reports its write, then its end, in order.
	events := make(chan beatEvent, 2)
	inflight := false
	// waiting are kicks for the running beat; queued are kicks that arrived while an
	// older beat ran (it may have read the old body) and wait for the next one.
	var waiting, queued []chan bool
	answer := func(chs []chan bool, ok bool) {
		for _, ch := range chs {
			ch <- ok // buffered, one answer each
		}
	}
	defer func() { answer(waiting, false); answer(queued, false) }()
	for {
		select {
		case <-ctx.Done():
			// Wait for a running beat: a heartbeat write landing after Leave's delete
			// would bring this box back to life in its peers' eyes.
			for inflight {
				if ev := <-events; ev.done {
					inflight = false
				}
			}
			return
		case ch := <-m.kick:
			if inflight {
				queued = append(queued, ch)
				continue
			}
			waiting, inflight = []chan bool{ch}, true
			go m.beat(ctx, events)
		case <-ticker.C:
			if inflight {
				// The previous beat is still stuck on the bucket; its timeout ends it.
				m.stats.skipped.Add(1)
				continue
			}
			inflight = true
			go m.beat(ctx, events)
		case ev := <-events:
			if ev.done {
				inflight = false
				if len(queued) > 0 {
					waiting, queued, inflight = queued, nil, true
					go m.beat(ctx, events)
				}
			} else {
				if ev.ok {
					m.notePut(ev.sent, fenceTimer)
				}
				answer(waiting, ev.ok)
				waiting = nil
			}
		case <-fenceTimer.C:
			m.mu.Lock()
			since := time.Since(m.lastPutSent)
			m.mu.Unlock()
			if since >= m.fenceAfter {
				m.setFenced(true, since)
			}
		}
	}
}

// beatEvent is a beat's report to the loop: its heartbeat write (done false), then its end.
type beatEvent struct {
	done bool
	sent time.Time
	ok   bool
}

func (m *Membership) beat(ctx context.Context, events chan<- beatEvent) {
	defer func() { events <- beatEvent{done: true} }()
	safego.Run(m.logger, "membership beat", func() {
		sent, ok := m.putHeartbeat(ctx)
		events <- beatEvent{sent: sent, ok: ok}
		m.refresh(ctx)
	})
}

// notePut arms the fence timer from the send time of a successful write and lifts a fence.
func (m *Membership) notePut(sent time.Time, fenceTimer *time.Timer) {
	left := m.fenceAfter - time.Since(sent)
	if left <= 0 {
		// Succeeded, but sent so long ago that peers may already count us dead.
		return
	}
	fenceTimer.Reset(left)
	m.setFenced(false, 0)
}

// setFenced moves the box into or out of its fence; the lifecycle's observers (the
// engine) act on it.
func (m *Membership) setFenced(v bool, since time.Duration) {
	if m.life.Fenced() == v {
		return
	}
	if v {
		m.stats.fences.Add(1)
		m.logger.Warn("fencing this box: heartbeat writes are failing; stop serving and writing spaces before peers take them over",
			zap.Duration("last_successful_write_sent_ago", since),
			zap.Duration("fence_after", m.fenceAfter),
			zap.Duration("dead_after", m.cfg.DeadAfter))
	} else {
		m.logger.Info("heartbeat written; fence lifted (re-read each lease before serving its space again)")
	}
	m.life.Fence(v)
}

// Fenced reports whether this box is fenced: its last successful heartbeat write was sent
// more than FenceAfter ago, or it has not written one yet.
func (m *Membership) Fenced() bool { return m.life.Fenced() }

// putHeartbeat writes this box's heartbeat, returning when it was sent.
func (m *Membership) putHeartbeat(ctx context.Context) (time.Time, bool) {
	m.stats.beats.Add(1)
	m.measureLoad()
	m.stats.puts.Add(1)
	pctx, cancel := context.WithTimeout(ctx, m.cfg.OpTimeout)
	defer cancel()
	body := *m.body.Load()
	sent := time.Now()
	info, err := m.b.Put(pctx, m.key, bytes.NewReader(body), int64(len(body)), bucket.Cond{})
	if err != nil {
		if ctx.Err() == nil {
			m.stats.putErrors.Add(1)
			m.logger.Warn("writing heartbeat", zap.Error(err), zap.Int64("put_errors", m.stats.putErrors.Load()))
		}
		return sent, false
	}
	m.mu.Lock()
	if sent.After(m.lastPutSent) {
		m.lastPutSent = sent
		m.lastPutETag = info.ETag
	}
	m.mu.Unlock()
	return sent, true
}

// Fresh reports whether this box's last successful heartbeat write was sent less than
// the fence time (DeadAfter minus FenceMargin) ago, by the monotonic clock: what the fence
// timer decides, asked on the request path. A box paused past its fence (SIGSTOP, a stall
// of the machine) serves nothing when it resumes, even before its timer has run.
func (m *Membership) Fresh() bool {
	m.mu.Lock()
	sent := m.lastPutSent
	m.mu.Unlock()
	return !sent.IsZero() && time.Since(sent) < m.fenceAfter
}

// Stats returns a snapshot of the counters.
func (m *Membership) Stats() MembershipStats {
	s, r := &m.stats, &m.reader.stats
	return MembershipStats{
		Beats: s.beats.Load(), Puts: s.puts.Load(), PutErrors: s.putErrors.Load(),
		Lists: r.lists.Load(), ListErrors: r.listErrors.Load(),
		Gets: r.gets.Load(), GetErrors: r.getErrors.Load(),
		SkippedBeats: s.skipped.Load(), Fences: s.fences.Load(),
		ClockFallbacks: r.clockFallbacks.Load(), DuplicateSelf: s.duplicateSelf.Load(),
	}
}

// Close stops the heartbeat loop and waits for it; the heartbeat object stays (a config
// reload or a crash looks the same to peers). Close is idempotent.
func (m *Membership) Close() {
	m.runMu.Lock()
	cancel, done := m.cancel, m.done
	m.runMu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// MarkDraining is the first step of a drain. It rewrites this box's heartbeat with the
// draining flag and returns once that write succeeded (or ctx ends). Peers read the new
// body at their next listing (its ETag changes with its content, so the cached body is
// fetched again) and from then on leave this box out of placement (Owner) and fan-out
// (Targets); this box leaves itself out at once. The box is still live: the loop keeps
// beating with the draining body, so the leases it holds stay valid while it checkpoints
// and releases them one by one, and it still fences itself if its writes fail.
//
// The mesh contract's wording is "delete the heartbeat first, then drain". Deleting
// first frees every lease this box holds while it is still writing those spaces: a peer
// may take a lease over, restore the manifest as it was before the final checkpoint and
// accept writes, and then the draining box's checkpoint swap succeeds against the
// manifest the peer read, so the peer is fenced out at its next sync and the writes it
// took are lost. Marking draining first has the same effect on placement (peers stop
// choosing this box within one listing), and each lease becomes free the moment its
// final checkpoint is in and it is released; Leave deletes the heartbeat at the end.
func (m *Membership) MarkDraining(ctx context.Context) error {
	m.runMu.Lock()
	started, done := m.started, m.done
	m.runMu.Unlock()
	// The box may be draining already (its lifecycle's Drain): the body and the view
	// follow it here, once or again, alike.
	m.life.Drain()
	if err := m.encodeBody(nil); err != nil {
		return err
	}
	m.mu.Lock()
	for i := range m.view {
		if m.view[i].Self == m.cfg.Self {
			m.view[i].Draining = true
		}
	}
	m.placement.SetView(m.view)
	m.mu.Unlock()
	if !started {
		return errors.New("membership not started")
	}
	ch := make(chan bool, 1)
	select {
	case m.kick <- ch:
	case <-done:
		return errors.New("membership stopped")
	case <-ctx.Done():
		return fmt.Errorf("writing draining heartbeat: %v", ctx.Err())
	}
	select {
	case ok := <-ch:
		if !ok {
			return errors.New("writing draining heartbeat failed")
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("writing draining heartbeat: %v", ctx.Err())
	}
}

// Draining reports whether the box is draining (MarkDraining, or its lifecycle's Drain).
func (m *Membership) Draining() bool { return m.life.Draining() }

// Leave stops the loop and deletes this box's heartbeat, so peers stop counting it at
// their next listing: the last step of a drain, after MarkDraining and after every space
// was checkpointed and its lease released. Whatever lease this box still holds is free in
// peers' eyes from that moment.
func (m *Membership) Leave(ctx context.Context) error {
	m.Close()
	if err := m.b.Delete(ctx, m.key, bucket.Cond{}); err != nil {
		return fmt.Errorf("deleting heartbeat: %v", err)
	}
	m.mu.Lock()
	kept := m.view[:0:0]
	for _, mem := range m.view {
		if mem.Self != m.cfg.Self {
			kept = append(kept, mem)
		}
	}
	m.view = kept
	m.placement.SetView(kept)
	m.mu.Unlock()
	return nil
}
