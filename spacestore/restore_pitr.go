package spacestore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// Point-in-time restore between checkpoints. A log is kept as long as the history entry of
// the checkpoint it extends (Collect), so a checkpoint plus a prefix of its log is a state a
// restore can bring back: every write a kind of durability bucket acknowledged, not only
// the checkpoints.
//
// Which segments: the time of a segment is its LastModified, the bucket's clock when it
// landed. A segment carries no time of its own (its claim's time is the lease's), and the
// landing is the instant that matters: the holder acknowledges a commit only once the
// segment carrying it, and every one before it, has landed, so a write acknowledged at or
// before t is in a segment that landed at or before t. One clock, the bucket's, orders the
// segments of every holder, and the listing gives it without reading a segment. Its
// precision is the store's: S3 lists whole seconds, so a segment that landed within the
// second of t, after it, counts as at or before t.

// logEntry is one key of a log, as listed.
type logEntry struct {
	seq int64
	bucket.Info
}

// listLogEntries lists the log keys under prefix (LogPrefix or a LogGenPrefix of host), by
// generation, each generation's entries in seq order.
func listLogEntries(ctx context.Context, b bucket.Bucket, host, prefix string) (map[int64][]logEntry, error) {
	out := make(map[int64][]logEntry)
	token := ""
	for {
		page, err := b.List(ctx, prefix, token)
		if err != nil {
			return nil, fmt.Errorf("listing logs: %w", err)
		}
		for _, o := range page.Objects {
			if g, s, ok := parseLogRel(strings.TrimPrefix(o.Key, LogPrefix(host))); ok && s > 0 {
				out[g] = append(out[g], logEntry{seq: s, Info: o})
			}
		}
		if token = page.NextToken; token == "" {
			break
		}
	}
	for _, es := range out {
		sort.Slice(es, func(i, j int) bool { return es[i].seq < es[j].seq })
	}
	return out, nil
}

// logRun is the run of es (in seq order) from seq 1 up to the first missing seq: what
// ReadLog reads.
func logRun(es []logEntry) []logEntry {
	n := 0
	for n < len(es) && es[n].seq == int64(n+1) {
		n++
	}
	return es[:n]
}

// logUpTo returns the data segments of the log extending generation gen that a restore to
// time at applies, in order, and the LastModified of the last one: of the run from seq 1,
// the data segments ReadLog would apply (seals and stale segments left out, each segment
// checked by DecodeSegment), up to the first that landed after at. A segment that landed
// by at but after one that did not is left out too: nothing it carried was acknowledged by
// at, since a holder acknowledges a commit only once every segment before it has landed.
// Only the run up to its last segment that landed by at is downloaded.
//
// Errors: as ReadLog's: what is listed must be read whole, or the restore fails.
func logUpTo(ctx context.Context, b bucket.Bucket, host string, gen int64, at time.Time) ([]*Segment, time.Time, error) {
	logs, err := listLogEntries(ctx, b, host, LogGenPrefix(host, gen))
	if err != nil {
		return nil, time.Time{}, err
	}
	run := logRun(logs[gen])
	last := -1
	for i, e := range run {
		if !e.LastModified.After(at) {
			last = i
		}
	}
	if last < 0 {
		return nil, time.Time{}, nil
	}
	segs, err := fetchSegments(ctx, b, host, gen, 1, int64(last+1))
	if err != nil {
		return nil, time.Time{}, err
	}
	l := &Log{Gen: gen}
	var out []*Segment
	var through time.Time
	for i, seg := range segs {
		if !l.add(seg) {
			continue
		}
		if run[i].LastModified.After(at) {
			break
		}
		out = append(out, seg)
		through = run[i].LastModified
	}
	return out, through, nil
}

// rebuild restores old into a scratch directory under dir (os.TempDir() when empty),
// applies segs to it as a wake applies a log, and uploads what differs from old as a
// checkpoint of generation gen would (the changed pages as LTX deltas on old's images,
// objects under objs/<gen>/): it returns the files of the rebuilt state, for a manifest of
// gen. Nothing it writes is referenced until that manifest is swapped in.
func rebuild(ctx context.Context, b bucket.Bucket, host string, old *Manifest, segs []*Segment, gen int64, dir string, now time.Time) ([]File, error) {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
	}
	tmp, err := os.MkdirTemp(dir, "pitr-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	s := &Syncer{Bucket: b, Host: host, DataDir: filepath.Join(tmp, "data"), WorkDir: filepath.Join(tmp, "work"), manifest: old}
	if err := s.Restore(ctx); err != nil {
		return nil, fmt.Errorf("restoring checkpoint %d: %w", old.Generation, err)
	}
	if err := s.ApplySegments(nil, segs); err != nil {
		return nil, err
	}
	up := newUploader(b, host, old)
	var st Stats
	files, _, _, _, err := s.walk(ctx, Periodic, gen, now, up, &st)
	if werr := up.wait(); err == nil {
		err = werr
	}
	if err != nil {
		return nil, fmt.Errorf("uploading the rebuilt state: %w", err)
	}
	return files, nil
}
