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

// pick finds t's checkpoint among hist (oldest first) no older than oldest.
func (t Target) pick(hist []Checkpoint, oldest time.Time) (Checkpoint, error) {
	var found *Checkpoint
	for i := range hist {
		cp := &hist[i]
		if t.Generation > 0 && cp.Generation == t.Generation {
			found = cp
		}
		if t.Generation == 0 && !cp.At.After(t.At) {
			found = cp // oldest first: the last one that fits is the newest
		}
	}
	if found == nil || found.Stored.Before(oldest) {
		return Checkpoint{}, fmt.Errorf("%s: %w", t, ErrNoCheckpoint)
	}
	return *found, nil
}

// RestoreResult describes a point-in-time restore.
type RestoreResult struct {
	From       Checkpoint `json:"from"`
	Generation int64      `json:"generation"` // the new generation, holding From's files
}

// RestoreTo makes the checkpoint t names the current state of the asleep space host, as a new
// generation (so the restore itself is undone by restoring the generation before it). It
// takes the space's lease as h first: a space awake anywhere (a live holder) is refused with a
// *LeaseHeldError and nothing is written. No object is copied: the new manifest references
// the old checkpoint's objects, which GC keeps while any retained manifest does.
//
// h must not be the holder of an engine that may have the space awake (a box's own lease is
// free to itself): callers on a box check their own engine first.
func RestoreTo(ctx context.Context, b bucket.Bucket, host string, h Holder, t Target, retention time.Duration, now time.Time) (RestoreResult, error) {
	if retention <= 0 {
		retention = DefaultRetention
	}
	hist, bnow, err := History(ctx, b, host)
	if err != nil {
		return RestoreResult{}, err
	}
	cp, err := t.pick(hist, bnow.Add(-retention))
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
	m := &Manifest{Format: max(old.Format, 1), Generation: 1, Files: old.Files, WrittenBy: h.ID, WrittenAt: now.UTC(), RestoredFrom: cp.Generation}
	if cur != nil {
		m.Generation, m.NextWake = cur.Generation+1, cur.NextWake
	}
	if _, err := WriteManifest(ctx, b, host, m, etag); err != nil {
		return RestoreResult{}, err
	}
	if err := WriteHistory(ctx, b, host, m); err != nil {
		return RestoreResult{}, err
	}
	return RestoreResult{From: cp, Generation: m.Generation}, nil
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
