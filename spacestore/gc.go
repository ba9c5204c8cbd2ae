package spacestore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// GC tuning. A checkpoint collects every gcInterval generations. The newest keepGenerations
// checkpoints are kept whatever their age; anything younger than the grace
// period (by the bucket's clock) is never deleted.
const (
	gcInterval      = 64
	keepGenerations = 16
)

// DefaultGCGrace is how young (by the bucket's clock) an object or history entry must be to
// be kept whatever else holds: uploads and restores in flight finish well within it.
const DefaultGCGrace = time.Hour

// GCStats describes one garbage collection.
type GCStats struct {
	Objects        int   // objects left under objs/ and blobs/
	Bytes          int64 // their bytes
	Deleted        int
	BytesDeleted   int64
	History        int // history entries left
	HistoryDeleted int
	LogsDeleted    int // log segments deleted with the checkpoints they extend
}

// Collect deletes a space's objects that no retained manifest references, history entries
// past retention, and the logs of the checkpoints whose entries are not retained (the log of
// generation g goes with the entry of g: a point-in-time restore applies it on top of that
// checkpoint; see CollectLogs for the grace a seal needs). It runs under the space's lease (a checkpoint calls it), and is safe beside
// writers that are not: the roots are the current manifest (read afresh) and every history
// entry younger than retention plus grace or among the newest keepGenerations; an object is
// deleted only if no root references it, it belongs to a generation no newer than the current
// one (so uploads for the next generation survive, even a fenced-out writer's), and it is older
// than grace. Writers reference only objects of the manifest they build on or new ones of
// their own generation (see uploader), so an object found unreferenced here is never
// referenced again. A format-1 blob is only collected once the manifest is format 2.
//
// cache (may be nil) keeps the references of history entries across calls.
// grace is normally DefaultGCGrace; tests and benchmarks pass 0.
func Collect(ctx context.Context, b bucket.Bucket, host string, retention, grace time.Duration, cache map[string][]Ref) (GCStats, error) {
	var st GCStats
	if retention <= 0 {
		retention = DefaultRetention
	}
	cur, _, err := ReadManifest(ctx, b, host)
	if err != nil || cur == nil {
		return st, err
	}
	hist, now, err := History(ctx, b, host)
	if err != nil {
		return st, err
	}
	keep := make(map[string]bool)
	for _, r := range cur.Refs() {
		keep[r.Key] = true
	}
	var roots, expired []Checkpoint
	rootGens := make(map[int64]bool)
	for _, cp := range hist {
		if cp.Generation > cur.Generation-keepGenerations || cp.Stored.After(now.Add(-retention-grace)) {
			roots = append(roots, cp)
			rootGens[cp.Generation] = true
		} else {
			expired = append(expired, cp)
		}
	}
	refs, err := historyRefs(ctx, b, roots, cache)
	if err != nil {
		return st, err
	}
	for _, rs := range refs {
		for _, r := range rs {
			keep[r.Key] = true
		}
	}
	base := "spaces/" + host + "/"
	sweep := func(prefix string, collectable func(rel string) bool) error {
		objs, err := listAll(ctx, b, base+prefix)
		if err != nil {
			return err
		}
		for _, o := range objs {
			rel := strings.TrimPrefix(o.Key, base)
			if keep[rel] || !collectable(rel) || o.LastModified.After(now.Add(-grace)) {
				st.Objects++
				st.Bytes += o.Size
				continue
			}
			if err := b.Delete(ctx, o.Key, bucket.Cond{}); err != nil {
				return fmt.Errorf("deleting %s: %w", o.Key, err)
			}
			st.Deleted++
			st.BytesDeleted += o.Size
		}
		return nil
	}
	err = sweep("objs/", func(rel string) bool {
		g, ok := objGen(rel)
		return ok && g <= cur.Generation
	})
	if err != nil {
		return st, err
	}
	if err := sweep("blobs/", func(string) bool { return cur.Format >= 2 }); err != nil {
		return st, err
	}
	// Logs before their entries: a log whose entry is gone is never read again, an entry
	// whose log is gone would restore without it.
	st.LogsDeleted, err = CollectLogs(ctx, b, host, func(g int64) bool {
		return rootGens[g] || g > cur.Generation-keepGenerations
	}, grace)
	if err != nil {
		return st, err
	}
	for _, cp := range expired {
		if err := b.Delete(ctx, cp.Key, bucket.Cond{}); err != nil {
			return st, fmt.Errorf("deleting history entry: %w", err)
		}
		delete(cache, cp.Key)
		st.HistoryDeleted++
	}
	st.History = len(roots)
	return st, nil
}

// objGen parses the generation of "objs/<gen>/<sha256>".
func objGen(rel string) (int64, bool) {
	g, ok := strings.CutPrefix(rel, "objs/")
	if !ok || len(g) < 17 || g[16] != '/' {
		return 0, false
	}
	n, err := strconv.ParseInt(g[:16], 16, 64)
	return n, err == nil
}

// historyRefs reads the references of history entries, several at a time, through cache.
func historyRefs(ctx context.Context, b bucket.Bucket, cps []Checkpoint, cache map[string][]Ref) ([][]Ref, error) {
	out := make([][]Ref, len(cps))
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	var missing []int
	for i, cp := range cps {
		if rs, ok := cache[cp.Key]; ok {
			out[i] = rs
		} else {
			missing = append(missing, i)
		}
	}
	sem := make(chan struct{}, 8)
	for _, i := range missing {
		cp := cps[i]
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			m, err := readHistory(ctx, b, cp)
			mu.Lock()
			defer mu.Unlock()
			if errors.Is(err, bucket.ErrNotFound) {
				return // expired by another collector meanwhile
			}
			if err != nil {
				if first == nil {
					first = err
				}
				return
			}
			out[i] = m.Refs()
			if cache != nil {
				cache[cp.Key] = out[i]
			}
		}()
	}
	wg.Wait()
	return out, first
}

func listAll(ctx context.Context, b bucket.Bucket, prefix string) ([]bucket.Info, error) {
	var out []bucket.Info
	token := ""
	for {
		page, err := b.List(ctx, prefix, token)
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", prefix, err)
		}
		out = append(out, page.Objects...)
		if token = page.NextToken; token == "" {
			return out, nil
		}
	}
}
