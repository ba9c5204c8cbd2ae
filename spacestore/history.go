package spacestore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// DefaultRetention is how long checkpoints stay restorable unless a kind says otherwise.
const DefaultRetention = 7 * 24 * time.Hour

// Checkpoint is one entry of a space's history: the manifest of generation Generation,
// written at At, with Size bytes of files.
type Checkpoint struct {
	Generation int64     `json:"generation"`
	At         time.Time `json:"at"`
	Size       int64     `json:"size"`
	Key        string    `json:"-"`
	// Stored is the bucket's own time of the entry (its LastModified).
	Stored time.Time `json:"-"`
	// Log is the log that extends this checkpoint (the writes a kind of durability bucket
	// acknowledged after it), as Timeline's listing sees it; nil when it has none.
	Log *LogSpan `json:"log,omitempty"`
}

// LogSpan describes the log extending a checkpoint from a listing alone (no segment is
// read): Segments is the run from seq 1 a wake or a restore would read, First and Last the
// bucket's LastModified of its first and last segment. The run includes the seals of later
// wakes (a listing cannot tell them from data segments; they add no state). Every time from
// the checkpoint's to Last is a point `restore --at` brings back the newest acknowledged
// state of. Orphans counts segments past a gap in the seqs, which nothing applies.
type LogSpan struct {
	Segments int       `json:"segments"`
	First    time.Time `json:"first"`
	Last     time.Time `json:"last"`
	Orphans  int       `json:"orphans,omitempty"`
}

// WriteHistory stores a copy of m under history/, once per generation. Only the writer whose
// manifest swap succeeded calls it, after the swap.
func WriteHistory(ctx context.Context, b bucket.Bucket, host string, m *Manifest) error {
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = b.Put(ctx, HistoryKey(host, m.Generation, m.WrittenAt, m.Size()), bytes.NewReader(body), int64(len(body)), bucket.Cond{IfNoneMatch: true})
	if err != nil && !bucket.LostRace(err) {
		return fmt.Errorf("writing history: %w", err)
	}
	return nil
}

// History lists a space's checkpoints, oldest first, and the bucket's clock at the listing.
// Names alone carry generation, time and size: no entry is read.
func History(ctx context.Context, b bucket.Bucket, host string) ([]Checkpoint, time.Time, error) {
	var out []Checkpoint
	var now time.Time
	prefix := HistoryPrefix(host)
	token := ""
	for {
		page, err := b.List(ctx, prefix, token)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("listing history: %w", err)
		}
		if now.IsZero() {
			now = page.Now
		}
		for _, o := range page.Objects {
			if cp, ok := parseHistoryKey(strings.TrimPrefix(o.Key, prefix)); ok {
				cp.Key, cp.Stored = o.Key, o.LastModified
				out = append(out, cp)
			}
		}
		if token = page.NextToken; token == "" {
			break
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Generation < out[j].Generation })
	if now.IsZero() {
		now = time.Now()
	}
	return out, now, nil
}

// Timeline is History with each checkpoint's log (Checkpoint.Log): what an operator can
// restore to. It costs the listings of history/ and log/, one request per 1000 keys.
func Timeline(ctx context.Context, b bucket.Bucket, host string) ([]Checkpoint, time.Time, error) {
	hist, now, err := History(ctx, b, host)
	if err != nil || len(hist) == 0 {
		return hist, now, err
	}
	logs, err := listLogEntries(ctx, b, host, LogPrefix(host))
	if err != nil {
		return nil, time.Time{}, err
	}
	for i := range hist {
		es := logs[hist[i].Generation]
		if len(es) == 0 {
			continue
		}
		run := logRun(es)
		span := &LogSpan{Segments: len(run), Orphans: len(es) - len(run)}
		for j, e := range run {
			if j == 0 || e.LastModified.Before(span.First) {
				span.First = e.LastModified
			}
			if e.LastModified.After(span.Last) {
				span.Last = e.LastModified
			}
		}
		hist[i].Log = span
	}
	return hist, now, nil
}

func parseHistoryKey(name string) (Checkpoint, bool) {
	parts := strings.Split(name, ".")
	if len(parts) != 3 || len(parts[0]) != 16 {
		return Checkpoint{}, false
	}
	gen, err1 := strconv.ParseInt(parts[0], 16, 64)
	ms, err2 := strconv.ParseInt(parts[1], 10, 64)
	size, err3 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || gen <= 0 {
		return Checkpoint{}, false
	}
	return Checkpoint{Generation: gen, At: time.UnixMilli(ms).UTC(), Size: size}, true
}

// readHistory reads the manifest a history entry holds.
func readHistory(ctx context.Context, b bucket.Bucket, cp Checkpoint) (*Manifest, error) {
	var m Manifest
	if _, err := getJSON(ctx, b, cp.Key, &m); err != nil {
		return nil, err
	}
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("history entry %d: %w", cp.Generation, err)
	}
	if m.Generation != cp.Generation {
		return nil, fmt.Errorf("history entry %d holds generation %d", cp.Generation, m.Generation)
	}
	return &m, nil
}

// Target names a checkpoint: a generation, or the newest checkpoint at or before a time.
type Target struct {
	Generation int64
	At         time.Time
}

// ParseTarget reads "--at": an RFC 3339 time or a generation number.
func ParseTarget(s string) (Target, error) {
	if s == "" {
		return Target{}, errors.New("required: an RFC 3339 time or a generation")
	}
	if g, err := strconv.ParseInt(s, 10, 64); err == nil {
		if g <= 0 {
			return Target{}, fmt.Errorf("generation %d: generations start at 1", g)
		}
		return Target{Generation: g}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return Target{}, fmt.Errorf("%q is neither an RFC 3339 time nor a generation", s)
	}
	return Target{At: t}, nil
}

func (t Target) String() string {
	if t.Generation > 0 {
		return "generation " + strconv.FormatInt(t.Generation, 10)
	}
	return t.At.UTC().Format(time.RFC3339)
}

// ErrNoCheckpoint means no checkpoint within retention matches a restore's target.
var ErrNoCheckpoint = errors.New("no checkpoint within retention matches")

// pick finds t's checkpoint among hist (oldest first) no older than oldest. A time target
// takes the newest checkpoint whose time (taken) is at or before it.
func (t Target) pick(hist []Checkpoint, oldest time.Time) (Checkpoint, error) {
	var found *Checkpoint
	for i := range hist {
		cp := &hist[i]
		if t.Generation > 0 && cp.Generation == t.Generation {
			found = cp
		}
		if t.Generation == 0 && !cp.taken().After(t.At) {
			found = cp // oldest first: the last one that fits is the newest
		}
	}
	if found == nil || found.Stored.Before(oldest) {
		return Checkpoint{}, fmt.Errorf("%s: %w", t, ErrNoCheckpoint)
	}
	return *found, nil
}

// taken is when cp became the space's state, on the clock its log's segments are placed
// by: its writer's time (At, taken just before the swap), or the bucket's LastModified of
// its history entry (written just after the swap) when that reads earlier. A store that
// lists whole seconds (S3) stamps the first segment after the checkpoint with a time
// before At, within the same second; the entry, written before that segment, then reads
// no later than it, so the checkpoint and its log stay in order.
func (cp Checkpoint) taken() time.Time {
	if !cp.Stored.IsZero() && cp.Stored.Before(cp.At) {
		return cp.Stored
	}
	return cp.At
}

// RestoreResult describes a point-in-time restore.
type RestoreResult struct {
	From       Checkpoint `json:"from"`
	Generation int64      `json:"generation"` // the new generation, holding From's files
	// Segments counts the data segments of From's log applied on top of it (a time target);
	// Through is the LastModified of the last of them.
	Segments int        `json:"segments,omitempty"`
	Through  *time.Time `json:"through,omitempty"`
}

// RestoreOptions are a point-in-time restore's settings.
type RestoreOptions struct {
	// Retention is how far back a checkpoint may be restored; default DefaultRetention.
	Retention time.Duration
	// WorkDir is where a restore that applies log segments rebuilds the state: it needs room
	// for the space's files, and nothing is left in it. Default os.TempDir().
	WorkDir string
	// SealLog seals the log of the current generation (with the restore's lease) before the
	// swap, as a wake does: a kind of durability bucket, whose earlier holder, paused, could
	// otherwise append to it after the restore and acknowledge a write nobody reads.
	SealLog bool
}

// RestoreTo is RestoreToWith with only a retention.
func RestoreTo(ctx context.Context, b bucket.Bucket, host string, h Holder, t Target, retention time.Duration, now time.Time) (RestoreResult, error) {
	return RestoreToWith(ctx, b, host, h, t, RestoreOptions{Retention: retention}, now)
}

// RestoreToWith makes the state t names the current state of the asleep space host, as a
// new generation (so the restore itself is undone by restoring the generation before it). A
// generation names its checkpoint; a time names the newest acknowledged state at or before
// it: the newest checkpoint at or before it plus the data segments of that checkpoint's log
// that had landed by then (logUpTo).
//
// It takes the space's lease as h first: a space awake anywhere (a live holder) is refused
// with a *LeaseHeldError and nothing is written. A checkpoint alone is restored by
// reference, no object copied: the new manifest references the old checkpoint's objects,
// which GC keeps while any retained manifest does. A checkpoint plus segments is rebuilt in
// opts.WorkDir (rebuild: the checkpoint's files downloaded as a wake does, the segments
// applied, the changed pages uploaded as a checkpoint does) under the new generation.
//
// All or nothing: the one write that changes the space is the manifest's compare-and-swap,
// last but for the history entry. Before it, only objects of the new generation (unreferenced
// until the swap; GC keeps them while they are newer than the manifest and collects them
// once they are not and nothing references them) and, with opts.SealLog, a seal of the current
// log (what every wake writes) go to the bucket: a restore that dies before the swap leaves
// the space as it was. A restore never writes a log: a log of the new generation written
// before the swap would, after a crash, be read by the wake of the next checkpoint that takes
// that generation's number, on top of a state it does not extend. A crash between the swap
// and the history entry leaves the space restored, without its entry (as a checkpoint).
//
// h must not be the holder of an engine that may have the space awake (a box's own lease is
// free to itself): callers on a box check their own engine first.
func RestoreToWith(ctx context.Context, b bucket.Bucket, host string, h Holder, t Target, opts RestoreOptions, now time.Time) (RestoreResult, error) {
	if opts.Retention <= 0 {
		opts.Retention = DefaultRetention
	}
	hist, bnow, err := History(ctx, b, host)
	if err != nil {
		return RestoreResult{}, err
	}
	cp, err := t.pick(hist, bnow.Add(-opts.Retention))
	if err != nil {
		return RestoreResult{}, err
	}
	old, err := readHistory(ctx, b, cp)
	if err != nil {
		return RestoreResult{}, err
	}
	leaseETag, err := AcquireLease(ctx, b, host, h, now)
	if err != nil {
		return RestoreResult{}, err
	}
	defer ReleaseLease(context.WithoutCancel(ctx), b, host, leaseETag, h, now)
	// Every object must still be there: a box configured with a shorter retention may have
	// collected this checkpoint's objects already. Better refuse than install a state no
	// wake can restore.
	if err := checkRefs(ctx, b, host, old.Refs()); err != nil {
		return RestoreResult{}, fmt.Errorf("checkpoint %d is no longer complete in the bucket: %w", cp.Generation, err)
	}
	cur, etag, err := ReadManifest(ctx, b, host)
	if err != nil {
		return RestoreResult{}, err
	}
	if cur != nil && opts.SealLog {
		claim := Claim{Holder: h.ID, Incarnation: h.Incarnation, Lease: leaseETag, At: now.UTC()}
		lg, err := ReadLog(ctx, b, host, cur.Generation)
		if err != nil {
			return RestoreResult{}, fmt.Errorf("reading the current log: %w", err)
		}
		if _, _, err := SealLog(ctx, b, host, cur.Generation, claim, lg); err != nil {
			return RestoreResult{}, fmt.Errorf("sealing the current log: %w", err)
		}
	}
	m := &Manifest{Format: max(old.Format, 1), Generation: 1, Files: old.Files, WrittenBy: h.ID, WrittenAt: now.UTC(), RestoredFrom: cp.Generation}
	if cur != nil {
		m.Generation, m.NextWake = cur.Generation+1, cur.NextWake
	}
	res := RestoreResult{From: cp}
	if t.Generation == 0 {
		// Read after the seal: the log of the current generation is final from there on.
		segs, through, err := logUpTo(ctx, b, host, cp.Generation, t.At)
		if err != nil {
			return RestoreResult{}, err
		}
		if len(segs) > 0 {
			files, err := rebuild(ctx, b, host, old, segs, m.Generation, opts.WorkDir, now)
			if err != nil {
				return RestoreResult{}, fmt.Errorf("applying %d log segments to checkpoint %d: %w", len(segs), cp.Generation, err)
			}
			m.Format, m.Files = Format, files
			res.Segments, res.Through = len(segs), &through
		}
	}
	if _, err := WriteManifest(ctx, b, host, m, etag); err != nil {
		return RestoreResult{}, err
	}
	if err := WriteHistory(ctx, b, host, m); err != nil {
		return RestoreResult{}, err
	}
	res.Generation = m.Generation
	return res, nil
}

// checkRefs HEADs every object, several at a time.
func checkRefs(ctx context.Context, b bucket.Bucket, host string, refs []Ref) error {
	sem := make(chan struct{}, fetchConcurrency)
	errs := make(chan error, len(refs))
	for _, r := range refs {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			info, err := b.Head(ctx, RefKey(host, r))
			if err == nil && info.Size != r.Size {
				err = fmt.Errorf("%s is %d bytes, want %d", r.Key, info.Size, r.Size)
			}
			errs <- err
		}()
	}
	var first error
	for range refs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
