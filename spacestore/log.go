package spacestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/internal/safego"
)

// A space's log keeps what a checkpoint has not yet: between two manifest swaps, each group
// of SQLite commits is shipped as a numbered segment, and the box holds every answer until
// the segments covering the commits before it have landed (the output gate). A restore
// applies the manifest's state and then its log, so a box killed between checkpoints loses
// no write it acknowledged.
//
// Layout (keys relative to the bucket's prefix; keys.go's layout comment should list it):
//
//	spaces/<host>/log/<gen %016x>/<seq %016x>  segment seq (from 1) of the log extending
//	                                            manifest generation gen
//
// gen is the generation of the manifest the segments extend: the one the holder restored
// (and fenced, which keeps the generation) or last checkpointed. A checkpoint of generation
// gen+1 includes every segment shipped under gen (the engine ships and checkpoints one at a
// time), so the holder starts the log of gen+1 at seq 1. An older log is kept as long as
// the history entry of the checkpoint it extends, for point-in-time restore (restore_pitr.go),
// and collected with it (Collect, CollectLogs).
//
// Fencing works as the manifest's does, with If-None-Match in place of If-Match: every
// segment is written at its seq only if that key is free. A holder that takes a space over
// reads the log and writes a seal (a segment that carries its claim and no pages) at the
// first free seq (SealLog); the old holder's next append lands on a taken key and fails
// (ErrLogSealed), so nothing it acknowledges after the seal can be missing from the log.
// This is SlateDB's fencing of WAL objects by sequence number.
//
// Reading (ReadLog): the segments from seq 1 up to the first missing seq, in order. Seals
// hand the log over: after a seal only segments carrying the seal's claim count; any other
// is a write of a holder the seal shut out (one that wrote past a gap, see ReadLog) and is
// skipped. Every segment is checked (DecodeSegment): a malformed one fails the read rather
// than end the log early, since the writes it carried may have been acknowledged.

// ErrLogSealed means a log segment's key was taken by another writer: a holder that took
// the space over sealed the log there, or another holder wrote that seq. The segment did not
// land, and nothing it carried may be acknowledged; the caller stops writing this log (its
// instance is fenced out).
var ErrLogSealed = errors.New("log sealed by another holder")

// Log bounds. A segment is untrusted input on restore: each length is checked before it is
// used, and nothing is allocated for data the segment does not hold.
const (
	// maxSegmentBytes bounds a segment's encoding (what a restore reads of one object).
	maxSegmentBytes = 256 << 20
	// maxSegmentDBs bounds the databases of one segment.
	maxSegmentDBs = 4096
	// maxLogPages bounds a database's page count in a segment (64 GiB at 4 KiB pages):
	// a restore keeps a hash per page.
	maxLogPages = 1 << 24
	// maxLogPath and maxLogString bound a path and each field of the claim.
	maxLogPath   = 4096
	maxLogString = 1024
	// logFetchConcurrency is how many segments a read downloads at once.
	logFetchConcurrency = fetchConcurrency
)

// LogPrefix is the prefix of every log of a space.
func LogPrefix(host string) string { return "spaces/" + host + "/log/" }

// LogGenPrefix is the prefix of the log extending generation gen.
func LogGenPrefix(host string, gen int64) string {
	return fmt.Sprintf("%s%016x/", LogPrefix(host), gen)
}

// LogKey is the key of segment seq of the log extending generation gen.
func LogKey(host string, gen, seq int64) string {
	return fmt.Sprintf("%s%016x", LogGenPrefix(host, gen), seq)
}

// parseLogRel parses "<gen>/<seq>" (a key less LogPrefix).
func parseLogRel(rel string) (gen, seq int64, ok bool) {
	g, s, found := strings.Cut(rel, "/")
	if !found || len(g) != 16 || len(s) != 16 {
		return 0, 0, false
	}
	ug, err1 := strconv.ParseUint(g, 16, 63)
	us, err2 := strconv.ParseUint(s, 16, 63)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return int64(ug), int64(us), true
}

// AppendSegment writes seg (a data segment, not a seal) at its seq of the log of seg.Gen,
// only if that key is free. Appends of consecutive segments may run at once (a holder
// pipelines them), but a segment extends the state the previous one left, so nothing a
// segment carries may be acknowledged before every segment before it has landed too: a
// reader stops at the first missing seq (ReadLog).
//
// Errors: ErrLogSealed (wrapped; errors.Is) means the key was taken by another writer (a
// takeover's seal or another holder's segment): the segment did not land, nothing it
// carried may be acknowledged, and this holder writes the log no more. Any other error may
// have been applied (a timeout, a cut connection): call AppendSegment again with the same
// segment, which answers nil once it finds its own bytes at the key, and acknowledge
// nothing it carried until then.
func AppendSegment(ctx context.Context, b bucket.Bucket, host string, seg *Segment) error {
	if seg.Seal {
		return errors.New("appending log segment: a seal is written by SealLog")
	}
	data, err := EncodeSegment(seg)
	if err != nil {
		return fmt.Errorf("appending log segment: %w", err)
	}
	key := LogKey(host, seg.Gen, seg.Seq)
	_, err = b.Put(ctx, key, bytes.NewReader(data), int64(len(data)), bucket.Cond{IfNoneMatch: true})
	if bucket.LostRace(err) {
		// The segment's bytes name this one write: its claim, seq and pages.
		if _, _, ok := bucket.Landed(ctx, b, key, data); ok {
			return nil
		}
		return fmt.Errorf("appending log segment %d of generation %d: %w", seg.Seq, seg.Gen, ErrLogSealed)
	}
	if err != nil {
		return fmt.Errorf("appending log segment %d of generation %d: %w", seg.Seq, seg.Gen, err)
	}
	return nil
}

// Log is what ReadLog found of the log of one generation.
type Log struct {
	Gen int64
	// Segments are the data segments to apply, in order: seals and stale segments are left
	// out.
	Segments []*Segment
	// Last is the seq of the last segment of the run from seq 1 (0: the log is empty): a
	// takeover seals after it.
	Last int64
	// Sealer is the claim of the run's newest seal (nil: none); after it only segments
	// carrying that claim count.
	Sealer *Claim
	// Stale lists the seqs of the run skipped because they follow a seal and carry another
	// claim: writes of a holder the seal shut out.
	Stale []int64
	// Orphans lists segments found past the first missing seq: never applied (ReadLog).
	Orphans []int64
}

// add takes the next segment of the run into the log and reports whether it is to be
// applied.
func (l *Log) add(seg *Segment) bool {
	l.Last = seg.Seq
	switch {
	case seg.Seal:
		c := seg.Claim
		l.Sealer = &c
		return false
	case l.Sealer != nil && !sameClaim(*l.Sealer, seg.Claim):
		l.Stale = append(l.Stale, seg.Seq)
		return false
	}
	l.Segments = append(l.Segments, seg)
	return true
}

// sameClaim reports whether two claims name the same lease acquisition (the time is only
// informative).
func sameClaim(a, b Claim) bool {
	return a.Holder == b.Holder && a.Incarnation == b.Incarnation && a.Lease == b.Lease
}

// ReadLog reads the log extending generation gen: the segments from seq 1 up to the first
// missing seq, downloaded in parallel and each checked (DecodeSegment), a malformed or
// misplaced one being an error. What follows a missing seq is never applied: a segment
// holds the pages a group of commits changed on top of the state the segments before it
// left, so applied without the missing one it would mix two states into a corrupt
// database; and no answer can depend on it, because a holder acknowledges a commit only
// once every segment up to the one carrying it has landed. Such segments are listed in
// Log.Orphans, and a seal written at the gap (SealLog) shuts them out for good.
//
// Errors: any error means the log could not be read whole (a failed listing or download, a
// malformed segment, a listed segment gone because a newer checkpoint collected it): the
// restore must fail rather than go on without it, since what is missing may have been
// acknowledged.
func ReadLog(ctx context.Context, b bucket.Bucket, host string, gen int64) (*Log, error) {
	seqs, err := listLog(ctx, b, host, gen)
	if err != nil {
		return nil, err
	}
	l := &Log{Gen: gen}
	run := int64(0)
	for run < int64(len(seqs)) && seqs[run] == run+1 {
		run++
	}
	l.Orphans = seqs[run:]
	segs, err := fetchSegments(ctx, b, host, gen, 1, run)
	if err != nil {
		return nil, err
	}
	for _, seg := range segs {
		l.add(seg)
	}
	return l, nil
}

// listLog lists the seqs of the log of gen, ascending.
func listLog(ctx context.Context, b bucket.Bucket, host string, gen int64) ([]int64, error) {
	var seqs []int64
	prefix := LogGenPrefix(host, gen)
	token := ""
	for {
		page, err := b.List(ctx, prefix, token)
		if err != nil {
			return nil, fmt.Errorf("listing log of generation %d: %w", gen, err)
		}
		for _, o := range page.Objects {
			if g, s, ok := parseLogRel(strings.TrimPrefix(o.Key, LogPrefix(host))); ok && g == gen && s > 0 {
				seqs = append(seqs, s)
			}
		}
		if page.NextToken == "" {
			return seqs, nil
		}
		token = page.NextToken
	}
}

// fetchSegments downloads and decodes segments first..last of the log of gen, in order.
func fetchSegments(ctx context.Context, b bucket.Bucket, host string, gen, first, last int64) ([]*Segment, error) {
	n := int(last - first + 1)
	if n <= 0 {
		return nil, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	segs := make([]*Segment, n)
	errs := make([]error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(logFetchConcurrency, n) {
		safego.Go(&wg, nil, "spacestore.fetchSegments", func() {
			for i := range next {
				if p := safego.Run(nil, "spacestore.fetchSegment", func() {
					segs[i], errs[i] = fetchSegment(ctx, b, host, gen, first+int64(i))
				}); p != nil {
					errs[i] = fmt.Errorf("reading log segment %d: panic: %v", first+int64(i), p)
				}
				if errs[i] != nil {
					cancel()
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			return nil, errs[i]
		}
		if segs[i] == nil {
			return nil, ctx.Err()
		}
	}
	return segs, nil
}

// fetchSegment downloads and decodes segment seq of the log of gen.
func fetchSegment(ctx context.Context, b bucket.Bucket, host string, gen, seq int64) (*Segment, error) {
	obj, err := b.Get(ctx, LogKey(host, gen, seq))
	if err != nil {
		// A listed segment that is gone was collected: the manifest moved on, and this
		// restore's fence will fail; reading it as the end of the log would drop writes.
		return nil, fmt.Errorf("reading log segment %d of generation %d: %w", seq, gen, err)
	}
	defer obj.Body.Close()
	data, err := io.ReadAll(io.LimitReader(obj.Body, maxSegmentBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading log segment %d of generation %d: %w", seq, gen, err)
	}
	seg, err := DecodeSegment(data)
	if err != nil {
		return nil, fmt.Errorf("log segment %d of generation %d: %w", seq, gen, err)
	}
	if seg.Gen != gen || seg.Seq != seq {
		return nil, fmt.Errorf("log segment %d of generation %d says it is segment %d of generation %d", seq, gen, seg.Seq, seg.Gen)
	}
	return seg, nil
}

// SealLog hands the log of gen over to the holder of claim, which took the space over and
// has read the log (after, from ReadLog): it writes a seal carrying claim at the first free
// seq after after.Last, with If-None-Match. A segment that lands there meanwhile (the old
// holder still appending) is read, added to after, and returned in more when it is to be
// applied too, and the seal is tried at the next seq. Once the seal lands, every later
// append of an earlier holder fails with ErrLogSealed. next is the seq this holder appends
// at: the one after the seal, or after the orphans that follow it when the seal filled a gap
// (they carry another claim, so readers skip them).
//
// Every wake should seal, not only a takeover of an unreleased lease: like the fence of the
// manifest, it costs one conditional PUT and no wake can tell for sure that no earlier holder
// is still writing.
//
// Errors: anything but nil may have left the seal written or not; the wake fails and its
// retry reads the log again (a seal of this same claim read back is harmless). A segment
// that fails DecodeSegment is an error, as in ReadLog.
func SealLog(ctx context.Context, b bucket.Bucket, host string, gen int64, claim Claim, after *Log) (more []*Segment, next int64, err error) {
	if after == nil || after.Gen != gen {
		return nil, 0, fmt.Errorf("sealing log of generation %d: the log read is of another generation", gen)
	}
	orphans := make(map[int64]bool, len(after.Orphans))
	for _, s := range after.Orphans {
		orphans[s] = true
	}
	for {
		if err := ctx.Err(); err != nil {
			return more, 0, err
		}
		seq := after.Last + 1
		data, err := EncodeSegment(&Segment{Gen: gen, Seq: seq, Claim: claim, Seal: true})
		if err != nil {
			return more, 0, fmt.Errorf("sealing log: %w", err)
		}
		key := LogKey(host, gen, seq)
		_, err = b.Put(ctx, key, bytes.NewReader(data), int64(len(data)), bucket.Cond{IfNoneMatch: true})
		if bucket.LostRace(err) {
			if _, _, ok := bucket.Landed(ctx, b, key, data); ok {
				err = nil
			}
		}
		if err == nil {
			after.add(&Segment{Gen: gen, Seq: seq, Claim: claim, Seal: true})
			next = seq + 1
			for orphans[next] {
				next++
			}
			return more, next, nil
		}
		if !bucket.LostRace(err) {
			return more, 0, fmt.Errorf("sealing log of generation %d at %d: %w", gen, seq, err)
		}
		seg, err := fetchSegment(ctx, b, host, gen, seq)
		if err != nil {
			return more, 0, err
		}
		delete(orphans, seq)
		if after.add(seg) {
			more = append(more, seg)
		}
	}
}

// LogPrefixesBefore lists the prefixes of the logs of generations below gen, oldest first.
func LogPrefixesBefore(ctx context.Context, b bucket.Bucket, host string, gen int64) ([]string, error) {
	var out []string
	err := listLogsBefore(ctx, b, host, gen, func(g int64, _ bucket.Info, _ time.Time) error {
		if p := LogGenPrefix(host, g); len(out) == 0 || out[len(out)-1] != p {
			out = append(out, p)
		}
		return nil
	})
	return out, err
}

// listLogsBefore calls fn for each log key of a generation below gen, in lexical order (so
// by generation, then seq), with the bucket's clock as its listing page said it, and stops
// listing at the first key of gen or later.
func listLogsBefore(ctx context.Context, b bucket.Bucket, host string, gen int64, fn func(g int64, o bucket.Info, now time.Time) error) error {
	prefix := LogPrefix(host)
	token := ""
	for {
		page, err := b.List(ctx, prefix, token)
		if err != nil {
			return fmt.Errorf("listing logs: %w", err)
		}
		for _, o := range page.Objects {
			rel := strings.TrimPrefix(o.Key, prefix)
			g, _, ok := parseLogRel(rel)
			if !ok {
				// Not a segment key; its generation prefix still orders it.
				gs, _, _ := strings.Cut(rel, "/")
				u, err := strconv.ParseUint(gs, 16, 63)
				if len(gs) != 16 || err != nil {
					continue
				}
				g = int64(u)
			}
			if g >= gen {
				return nil
			}
			if err := fn(g, o, page.Now); err != nil {
				return err
			}
		}
		if page.NextToken == "" {
			return nil
		}
		token = page.NextToken
	}
}

// CollectLogs deletes the logs of generations below the current manifest's (read afresh)
// that keep does not keep (nil keeps none): a log is what a point-in-time restore applies on
// top of the checkpoint it extends, so it lives as long as that checkpoint's history entry,
// and Collect, which expires the entries, is its caller. The log of the current generation,
// or a later one, is never touched. It is safe to run more than once and beside writers,
// and it returns how many segments it deleted. A failure leaves the rest for the next run.
//
// A key younger than grace (by the bucket's clock) is kept: a seal is what refuses an
// earlier holder's late append, and an append that reached the store after its seal was
// deleted would land on a free key and be acknowledged, in a log nobody reads again. grace
// (the kind's gc_grace, as for objects) must outlast any request still in flight, as it
// must for the objects GC keeps; S3 refuses a signed request older than 15 minutes. A log
// kept for its checkpoint's retention (days) is far older than that when it goes.
func CollectLogs(ctx context.Context, b bucket.Bucket, host string, keep func(gen int64) bool, grace time.Duration) (int, error) {
	cur, _, err := ReadManifest(ctx, b, host)
	if err != nil {
		return 0, err
	}
	if cur == nil {
		return 0, nil
	}
	deleted := 0
	err = listLogsBefore(ctx, b, host, cur.Generation, func(g int64, o bucket.Info, now time.Time) error {
		if keep != nil && keep(g) {
			return nil
		}
		if now.IsZero() {
			now = time.Now() // a store that reports no clock
		}
		if now.Sub(o.LastModified) < grace {
			return nil
		}
		if err := b.Delete(ctx, o.Key, bucket.Cond{}); err != nil {
			return fmt.Errorf("deleting %s: %w", o.Key, err)
		}
		deleted++
		return nil
	})
	return deleted, err
}
