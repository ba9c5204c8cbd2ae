// Package standby is the standby's side of a warm standby (issue 38): the spool where a box
// keeps, per space, the stream of log segments the space's holder ships to it, each on disk
// (fsynced) before the standby answers, so the holder may acknowledge the writes a segment
// carries once its standby has it; the seal a takeover puts on a holder's stream, after
// which that holder gets no acknowledgement from this box again; and the wire both boxes
// speak under /api/mesh/standby/ (wire.go). It imports no Caddy and nothing of the box but
// spacestore's segment and claim and registry's host rule.
//
// A stream is the segments one holder (one claim) cut in one generation of the space's
// log, numbered by the stream's own seq from 1 (spacestore.Segment.Seq), each with the seq
// of the last segment of the bucket log the holder had cut before it (Entry.BucketBefore),
// which orders the stream against the bucket log: a takeover (engine/standby.go) takes the
// stream when its last entry was cut after the bucket log's last segment, rebuilding from
// the bucket log up to the stream's base and the whole stream, and the bucket log
// otherwise.
//
// The rules of a stream (Put, Seal) live here and nowhere else:
//   - Seq 1 of a generation at least the current stream's, under a claim not sealed here,
//     starts a new stream for the host and drops the old one; the same seq 1 again (same
//     bytes) is a retry and changes nothing.
//   - Otherwise a segment extends the current stream: the same generation and claim, the
//     last seq plus one (ErrGap when not; ErrStale for an older generation or a claim whose
//     stream was replaced here).
//   - A sealed (generation, claim) is refused for good (ErrSealed), so a takeover that has
//     sealed the standby knows the old holder can complete no acknowledgement through it.
package standby

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"

	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
	"time"
)

// Entry is one segment of a holder's stream as the standby keeps it.
type Entry struct {
	// BucketBefore is the seq of the last segment of the bucket log the holder had cut when
	// it cut this one (orders the stream against the bucket log).
	BucketBefore int64
	// Data is the segment, spacestore.EncodeSegment's bytes: its Gen, Seq (the stream's
	// seq, from 1) and Claim (the holder's) inside.
	Data []byte
}

// Errors of Put and Seal; each is wrapped with what happened (errors.Is). The wire carries
// each one by name, so a Client's errors match them too.
var (
	// ErrSealed means a takeover sealed the stream of this generation and claim: the
	// segment was not stored and nothing it carries may be acknowledged through this
	// standby. The holder has lost the space.
	ErrSealed = errors.New("standby stream sealed by a takeover")
	// ErrStale means the segment belongs to an older stream than the one the standby keeps
	// (an older generation, or a claim whose stream was replaced here): not stored.
	ErrStale = errors.New("standby stream is stale")
	// ErrGap means the segment is not the next seq of the stream the standby keeps (a
	// segment lost or reordered, or the standby dropped the stream): not stored. The holder
	// sends the missing seqs, or starts a new stream at seq 1.
	ErrGap = errors.New("not the next seq of the standby stream")
	// ErrConflict means the standby holds other bytes at this seq of the same stream: not
	// stored. A holder never sends two segments at one seq, so this is a bug or a stream
	// restarted by two writers; the holder starts a new stream.
	ErrConflict = errors.New("standby holds another segment at this seq")
	// ErrFull means storing the segment would take the host's stream past MaxHostBytes: not
	// stored. The holder checkpoints (a new generation starts a new stream) or falls back
	// to bucket proofs.
	ErrFull = errors.New("standby spool full for this host")
	// ErrMalformed means the request is not one the spool can take (an invalid host name, a
	// segment that does not decode, a seal segment, a negative BucketBefore): nothing was
	// stored. Retrying the same request cannot succeed.
	ErrMalformed = errors.New("malformed standby request")
	// ErrClosed means the spool was closed.
	ErrClosed = errors.New("standby spool closed")
)

// Defaults of the spool's bounds.
const (
	DefaultMaxHostBytes    = 256 << 20
	DefaultMaxSegmentBytes = 64 << 20
)

// Bounds on what the spool remembers of seals and replaced streams, per host. A claim names
// one lease acquisition, so only the recent ones can still send; the oldest go first.
const (
	maxSeals = 64
	maxPast  = 16
)

// Spool keeps, per host, the stream of its current holder. Safe for concurrent use: puts of
// different hosts run at once, each host's one at a time.
type Spool struct {
	// MaxHostBytes bounds a host's stream: the size of its entries as a seal answer carries
	// them (each entry's data plus 12 bytes). Default 256 MiB. Set it before the spool is
	// shared.
	MaxHostBytes int64
	// MaxSegmentBytes bounds one segment a peer may send (ServePeer answers 413 past it).
	// Default 64 MiB. Set it before the spool is shared.
	MaxSegmentBytes int64
	// Started, when set, is called after a Put that started a new stream of host at
	// generation gen has returned its lock (the box warms its copy of the space: engine
	// Prewarm). It must not block. Set it before the spool is shared.
	Started func(host string, gen int64)
	// HandedOver, when set, is called after a Handover: the space slept on its holder's
	// drain, and this box, its standby, is where it wakes next (the box warms its copy
	// of the space's final checkpoint). It must not block. Set it before the spool is
	// shared.
	HandedOver func(host string)

	dir string

	// mu guards hosts and closed; each host's own state is under its own mutex, taken
	// after mu is released (never while holding mu).
	mu     sync.Mutex
	hosts  map[string]*hostSpool
	closed bool
}

// Open opens the spool kept in dir, creating dir (0700) if needed, and reads what is there:
// a restart keeps every stream, its entries and its seals. A torn last record (a put cut by
// a crash before it answered) is cut off. A spool it cannot read whole (a corrupt entry in
// the middle of a stream, a state file that does not parse) is an error naming the file:
// what is missing may have been acknowledged, so it is not silently dropped.
func Open(dir string) (*Spool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("opening standby spool: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("opening standby spool: %w", err)
	}
	s := &Spool{MaxHostBytes: DefaultMaxHostBytes, MaxSegmentBytes: DefaultMaxSegmentBytes, dir: dir, hosts: map[string]*hostSpool{}}
	for _, de := range ents {
		if !de.IsDir() || ValidateHost(de.Name()) != nil {
			continue
		}
		h, err := loadHost(dir, de.Name())
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("opening standby spool: %w", err)
		}
		if h != nil {
			s.hosts[h.name] = h
		}
	}
	return s, nil
}

// Close closes the spool's files; later calls answer ErrClosed. It is idempotent.
func (s *Spool) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	hosts := s.hosts
	s.hosts = nil
	s.mu.Unlock()
	var errs []error
	for _, h := range hosts {
		h.mu.Lock()
		h.gone = true
		h.movedLocked()
		if h.cur != nil {
			errs = append(errs, h.cur.f.Close())
		}
		h.mu.Unlock()
	}
	return errors.Join(errs...)
}

// ValidateHost accepts the host names the spool keeps: the registry's rule for a space's
// host (lowercase DNS labels of a-z, 0-9 and '-', at most 253 bytes; no '/', no empty
// label so no "..", no NUL). Each valid name is a safe directory name of its own.
func ValidateHost(host string) error {
	if err := registry.ValidateHost(host); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}

// host returns host's spool, locked, creating it when create is set (nil when it is not
// there and create is not set).
func (s *Spool) host(name string, create bool) (*hostSpool, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		h := s.hosts[name]
		if h == nil {
			if !create {
				s.mu.Unlock()
				return nil, nil
			}
			h = &hostSpool{name: name, root: s.dir, dir: filepath.Join(s.dir, name)}
			s.hosts[name] = h
		}
		s.mu.Unlock()
		h.mu.Lock()
		if !h.gone {
			return h, nil
		}
		h.mu.Unlock() // forgotten meanwhile (Drop, Close): look again
	}
}

// forgetLocked removes h from the map if it holds nothing; h is locked.
func (s *Spool) forgetLocked(h *hostSpool) {
	if h.cur != nil || len(h.seals) > 0 || len(h.past) > 0 {
		return
	}
	h.gone = true
	h.movedLocked()
	s.mu.Lock()
	if s.hosts[h.name] == h {
		delete(s.hosts, h.name)
	}
	s.mu.Unlock()
}

// Put stores e for host once it is on disk (the record written and its file fsynced; the
// file's directory entry was fsynced when the stream began). It decodes and checks e.Data
// (spacestore.DecodeSegment; a seal segment is refused). A segment with Seq 1 of a
// generation >= the current one's, under a claim not sealed here, starts a new stream for
// host (the old one dropped); otherwise Seq must be the last + 1 under the same gen and
// claim (ErrGap); a sealed stream refuses (ErrSealed, also for seq 1 of the same
// gen+claim); an older gen, or seq > 1 of a claim whose stream was replaced here: ErrStale.
// Put of the same seq again with the same bytes is nil (an idempotent retry); with other
// bytes ErrConflict, except seq 1, which starts the stream anew unless its BucketBefore is
// below the last entry's (then it is a delayed copy of an older start: ErrStale).
//
// Errors: ErrMalformed, ErrSealed, ErrStale, ErrGap, ErrConflict, ErrFull (wrapped) mean
// nothing was stored; any other error (a disk failure) means nothing it carries may be
// acknowledged, and the stream takes nothing but a new seq 1 after it.
func (s *Spool) Put(host string, e Entry) error {
	if err := ValidateHost(host); err != nil {
		return err
	}
	seg, err := spacestore.DecodeSegment(e.Data)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if seg.Seal {
		return fmt.Errorf("%w: a seal segment is not part of a stream", ErrMalformed)
	}
	if e.BucketBefore < 0 {
		return fmt.Errorf("%w: negative BucketBefore %d", ErrMalformed, e.BucketBefore)
	}
	h, err := s.host(host, true)
	if err != nil {
		return err
	}
	if !h.awaitTurnLocked(seg) {
		h.mu.Unlock()
		return fmt.Errorf("standby %s: segment %d of generation %d: %w: the host's spool was dropped meanwhile", host, seg.Seq, seg.Gen, ErrGap)
	}
	before := h.cur
	err = s.putLocked(h, seg, e)
	started := h.cur != before
	h.movedLocked()
	s.forgetLocked(h) // a refused first put leaves nothing listed
	h.mu.Unlock()
	if err != nil {
		return fmt.Errorf("standby %s: segment %d of generation %d: %w", host, seg.Seq, seg.Gen, err)
	}
	if started && s.Started != nil {
		s.Started(host, seg.Gen)
	}
	return nil
}

func (s *Spool) putLocked(h *hostSpool, seg *spacestore.Segment, e Entry) error {
	m := mark{Gen: seg.Gen, Claim: seg.Claim}
	if h.sealed(m) {
		return ErrSealed
	}
	cur := h.cur
	size := entrySize(e)
	if size > s.maxHostBytes() {
		return fmt.Errorf("%w: one entry of %d bytes, the cap is %d", ErrFull, size, s.maxHostBytes())
	}
	if cur == nil {
		if seg.Seq == 1 {
			return h.startLocked(m, e)
		}
		if h.replaced(m) {
			return ErrStale
		}
		return fmt.Errorf("%w: no stream here, want seq 1", ErrGap)
	}
	if seg.Gen < cur.gen {
		return fmt.Errorf("%w: generation %d is older than the stream's %d", ErrStale, seg.Gen, cur.gen)
	}
	if seg.Gen > cur.gen || !sameClaim(seg.Claim, cur.claim) {
		if seg.Seq == 1 {
			return h.startLocked(m, e)
		}
		if h.replaced(m) {
			return fmt.Errorf("%w: that claim's stream was replaced", ErrStale)
		}
		return fmt.Errorf("%w: no stream of that generation and claim here, want seq 1", ErrGap)
	}
	if seg.Seq <= int64(len(cur.ents)) {
		same, err := cur.same(seg.Seq, e)
		if err != nil {
			return err
		}
		switch {
		case same:
			return nil
		case seg.Seq != 1:
			return fmt.Errorf("%w: other bytes at seq %d", ErrConflict, seg.Seq)
		case e.BucketBefore < cur.ents[len(cur.ents)-1].bb:
			return fmt.Errorf("%w: a start at bucket seq %d, before the stream's last entry (%d)", ErrStale, e.BucketBefore, cur.ents[len(cur.ents)-1].bb)
		}
		return h.startLocked(m, e)
	}
	if cur.broken != nil {
		return fmt.Errorf("%w: the stream broke at seq %d (%v); start a new one", ErrGap, len(cur.ents)+1, cur.broken)
	}
	if seg.Seq != int64(len(cur.ents))+1 {
		return fmt.Errorf("%w: want seq %d", ErrGap, len(cur.ents)+1)
	}
	if cur.bytes+size > s.maxHostBytes() {
		return fmt.Errorf("%w: %d bytes held, %d more would pass the cap of %d", ErrFull, cur.bytes, size, s.maxHostBytes())
	}
	return cur.append(e)
}

// Seal marks host's stream of (gen, claim) sealed (refusing every later Put of that claim
// in that gen, from now on and after a restart) and returns its entries in seq order. A
// host with no stream, or a stream of another gen/claim: Seal records the seal anyway (so a
// Put that arrives later from that claim is refused) and returns no entries. Sealing again
// returns the same entries (a retried takeover). The seal is on disk before Seal returns.
//
// Errors: ErrMalformed (an invalid host or claim); any other error means the seal may not
// be recorded, and the takeover must not count on this standby's seal (it retries).
func (s *Spool) Seal(host string, gen int64, claim spacestore.Claim) ([]Entry, error) {
	if err := ValidateHost(host); err != nil {
		return nil, err
	}
	if err := checkClaim(claim); err != nil {
		return nil, err
	}
	h, err := s.host(host, true)
	if err != nil {
		return nil, err
	}
	defer h.mu.Unlock()
	m := mark{Gen: gen, Claim: claim}
	if !h.sealed(m) {
		seals := append(slices.Clone(h.seals), m)
		if len(seals) > maxSeals {
			// The oldest generation goes first, then the oldest seal of it.
			sort.SliceStable(seals, func(i, j int) bool { return seals[i].Gen < seals[j].Gen })
			seals = seals[len(seals)-maxSeals:]
		}
		if err := h.writeState(h.cur, seals, h.past); err != nil {
			s.forgetLocked(h)
			return nil, fmt.Errorf("standby %s: sealing: %w", host, err)
		}
		h.seals = seals
		h.movedLocked()
	}
	cur := h.cur
	if cur == nil || cur.gen != gen || !sameClaim(cur.claim, claim) {
		return nil, nil
	}
	ents, err := cur.entries()
	if err != nil {
		return nil, fmt.Errorf("standby %s: reading the sealed stream: %w", host, err)
	}
	return ents, nil
}

// Retire drops host's stream of (gen, claim) when it is the current one: its holder's
// checkpoint after it (the space slept) holds everything it carried. A stream of another
// generation or claim, and a sealed one (a takeover's), is left as it is; so is a host with
// no stream.
func (s *Spool) Retire(host string, gen int64, claim spacestore.Claim) error {
	if err := ValidateHost(host); err != nil {
		return err
	}
	if err := checkClaim(claim); err != nil {
		return err
	}
	h, err := s.host(host, false)
	if err != nil || h == nil {
		return err
	}
	cur := h.cur
	retire := cur != nil && cur.gen == gen && sameClaim(cur.claim, claim) && !h.sealed(mark{Gen: gen, Claim: claim})
	h.mu.Unlock()
	if !retire {
		return nil
	}
	return s.dropIf(host, cur)
}

// Handover is Retire for a space that slept because its holder drains: its standby is
// where it wakes next, and HandedOver hears of it.
func (s *Spool) Handover(host string, gen int64, claim spacestore.Claim) error {
	if err := s.Retire(host, gen, claim); err != nil {
		return err
	}
	if s.HandedOver != nil {
		s.HandedOver(host)
	}
	return nil
}

// Drop forgets host's stream (the space moved on: a checkpoint the standby heard of, a
// removal): its entries are deleted. The seals stay (a claim names one lease acquisition,
// so they never refuse a newer holder), so a sealed holder cannot start a stream here
// again. Dropping a host with no stream is nil.
func (s *Spool) Drop(host string) error {
	if err := ValidateHost(host); err != nil {
		return err
	}
	return s.dropIf(host, nil)
}

// dropIf drops host's current stream; only when it is still only (non-nil).
func (s *Spool) dropIf(host string, only *stream) error {
	h, err := s.host(host, false)
	if err != nil || h == nil {
		return err
	}
	defer h.mu.Unlock()
	if h.cur == nil || only != nil && h.cur != only {
		return nil
	}
	if err := h.writeState(nil, h.seals, h.past); err != nil {
		return fmt.Errorf("standby %s: dropping: %w", host, err)
	}
	old := h.cur
	h.cur = nil
	h.movedLocked()
	old.remove()
	if len(h.seals) == 0 && len(h.past) == 0 {
		os.RemoveAll(h.dir) // holds nothing; a leftover is harmless (Open skips it)
		syncDir(h.root)
	}
	s.forgetLocked(h)
	return nil
}

// HostStatus is one host's line in the spool's status.
type HostStatus struct {
	Host string `json:"host"`
	// Gen, Holder and LastSeq describe the current stream (all zero without one).
	Gen     int64  `json:"gen"`
	Holder  string `json:"holder,omitempty"`
	LastSeq int64  `json:"last_seq"`
	// BucketBefore is the last entry's: how far the bucket log had come when it was cut.
	BucketBefore int64 `json:"bucket_before"`
	// Bytes is the stream's size as a seal answer carries it (what MaxHostBytes bounds).
	Bytes int64 `json:"bytes"`
	// Sealed says a takeover sealed the current stream.
	Sealed bool `json:"sealed"`
	// Seals counts the seals kept for the host.
	Seals int `json:"seals,omitempty"`
	// Broken is the disk error that stopped the stream, if one did.
	Broken string `json:"broken,omitempty"`
}

// Status is what the spool holds, for /lchat/status: per host its gen, claim holder, last
// seq, bytes, sealed; sorted by host.
func (s *Spool) Status() []HostStatus {
	out := []HostStatus{} // JSON [] for none
	s.each(func(h *hostSpool) {
		st := HostStatus{Host: h.name, Seals: len(h.seals)}
		if c := h.cur; c != nil {
			st.Gen, st.Holder, st.LastSeq, st.Bytes = c.gen, c.claim.Holder, int64(len(c.ents)), c.bytes
			st.BucketBefore = c.ents[len(c.ents)-1].bb
			st.Sealed = h.sealed(mark{Gen: c.gen, Claim: c.claim})
			if c.broken != nil {
				st.Broken = c.broken.Error()
			}
		}
		out = append(out, st)
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out
}

// StreamRef names one host's stream.
type StreamRef struct {
	Host  string
	Gen   int64
	Claim spacestore.Claim
}

// Unsealed returns each host's current stream that no takeover sealed: the streams whose
// holders a standby that leaves the fleet asks to release it (release.go).
func (s *Spool) Unsealed() []StreamRef {
	var out []StreamRef
	s.each(func(h *hostSpool) {
		if c := h.cur; c != nil && !h.sealed(mark{Gen: c.gen, Claim: c.claim}) {
			out = append(out, StreamRef{Host: h.name, Gen: c.gen, Claim: c.claim})
		}
	})
	return out
}

// each calls f with each host's part of the spool, locked, skipping the dropped ones.
func (s *Spool) each(f func(h *hostSpool)) {
	s.mu.Lock()
	hosts := make([]*hostSpool, 0, len(s.hosts))
	for _, h := range s.hosts {
		hosts = append(hosts, h)
	}
	s.mu.Unlock()
	for _, h := range hosts {
		h.mu.Lock()
		if !h.gone {
			f(h)
		}
		h.mu.Unlock()
	}
}

func (s *Spool) maxHostBytes() int64 {
	if s.MaxHostBytes <= 0 {
		return DefaultMaxHostBytes
	}
	return s.MaxHostBytes
}

func (s *Spool) maxSegmentBytes() int64 {
	if s.MaxSegmentBytes <= 0 {
		return DefaultMaxSegmentBytes
	}
	return s.MaxSegmentBytes
}

// entrySize is e's size in a seal answer: BucketBefore, the length, the data.
func entrySize(e Entry) int64 { return 12 + int64(len(e.Data)) }

// mark names a stream: a generation and the claim of the holder writing it.
type mark struct {
	Gen   int64            `json:"gen"`
	Claim spacestore.Claim `json:"claim"`
}

func (m mark) is(o mark) bool { return m.Gen == o.Gen && sameClaim(m.Claim, o.Claim) }

// sameClaim reports whether two claims name the same lease acquisition (the time is only
// informative), as spacestore's log does.
func sameClaim(a, b spacestore.Claim) bool {
	return a.Holder == b.Holder && a.Incarnation == b.Incarnation && a.Lease == b.Lease
}

// checkClaim bounds a claim that came from a peer as a segment's does.
func checkClaim(c spacestore.Claim) error {
	for _, f := range []string{c.Holder, c.Incarnation, c.Lease} {
		if len(f) > 1024 || bytes.IndexByte([]byte(f), 0) >= 0 {
			return fmt.Errorf("%w: a claim field is longer than 1024 bytes or holds a NUL", ErrMalformed)
		}
	}
	return nil
}

// hostSpool is one host's part of the spool; its writer is whoever holds mu.
type hostSpool struct {
	name string
	root string // the spool's directory
	dir  string // root/name

	mu sync.Mutex
	// gone means the spool no longer maps name to this value: look it up again.
	gone bool
	// cur is the current stream, nil for none.
	cur *stream
	// seals are the sealed streams, past the replaced ones (most recent last).
	seals, past []mark
	// lastID is the highest stream file id used, so a new one never reuses a name.
	lastID int64
	// moved is signalled (with mu) at every change of the stream: the puts waiting for
	// their turn (awaitTurnLocked) look again. nil until one waits.
	moved *sync.Cond
}

// A holder sends one segment of its stream at a time (engine: the stream gate's Depth 1);
// one of an earlier version sent a few at once, and they may arrive out of order: a segment
// whose predecessors of its stream are on their way waits for them, up to reorderWait, if
// it is at most reorderAhead ahead of the stream's end.
const (
	reorderWait  = time.Second
	reorderAhead = 8
)

// awaitTurnLocked waits (h locked; the lock is let go while waiting) until the segment
// before seg of its stream has landed, the stream changed otherwise, or reorderWait passed;
// putLocked then decides. It reports false when h was dropped meanwhile.
func (h *hostSpool) awaitTurnLocked(seg *spacestore.Segment) bool {
	m := mark{Gen: seg.Gen, Claim: seg.Claim}
	deadline := time.Now().Add(reorderWait)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for !h.gone {
		if h.sealed(m) || h.replaced(m) || !time.Now().Before(deadline) {
			return true
		}
		cur := h.cur
		next := int64(1) // the stream is not here yet: its seq 1 may be on its way
		if cur != nil && cur.gen == seg.Gen && sameClaim(cur.claim, seg.Claim) {
			if cur.broken != nil {
				return true
			}
			next = int64(len(cur.ents)) + 1
		} else if cur != nil && seg.Gen < cur.gen {
			return true
		}
		if seg.Seq <= next || seg.Seq > next+reorderAhead {
			return true
		}
		if timer == nil {
			timer = time.AfterFunc(time.Until(deadline), func() {
				h.mu.Lock()
				h.movedLocked()
				h.mu.Unlock()
			})
		}
		h.cond().Wait()
	}
	return false
}

// cond is h's condition of a change (h.mu's), made on first use.
func (h *hostSpool) cond() *sync.Cond {
	if h.moved == nil {
		h.moved = sync.NewCond(&h.mu)
	}
	return h.moved
}

// movedLocked wakes the puts waiting for their turn (h locked).
func (h *hostSpool) movedLocked() {
	if h.moved != nil {
		h.moved.Broadcast()
	}
}

func (h *hostSpool) sealed(m mark) bool {
	return slices.ContainsFunc(h.seals, m.is)
}

func (h *hostSpool) replaced(m mark) bool {
	return slices.ContainsFunc(h.past, m.is)
}

// startLocked starts a new stream of m with e as its seq 1: the new file is written and
// fsynced, then the state names it, then the old stream's file goes.
func (h *hostSpool) startLocked(m mark, e Entry) error {
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return err
	}
	if err := syncDir(h.root); err != nil {
		return err
	}
	h.lastID++
	st, err := createStream(h.dir, h.lastID, m, e)
	if err != nil {
		return err
	}
	past := h.past
	if old := h.cur; old != nil && !old.mark().is(m) && !h.replaced(old.mark()) {
		past = append(slices.Clone(past), old.mark())
		if len(past) > maxPast {
			past = past[len(past)-maxPast:]
		}
	}
	if err := h.writeState(st, h.seals, past); err != nil {
		st.remove()
		return err
	}
	old := h.cur
	h.cur, h.past = st, past
	if old != nil {
		old.remove()
	}
	return nil
}
