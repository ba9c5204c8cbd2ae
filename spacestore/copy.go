package spacestore

import (
	"context"
	"errors"
	"fmt"

	"github.com/lchat/lchat-caddy/bucket"
)

// ErrSpaceAwake means a relocation's copy found the space's lease held by a live box.
var ErrSpaceAwake = errors.New("the space is awake")

// CopyResult says what CopySpace did.
type CopyResult struct {
	// Generation is the manifest generation now in the destination (0: none anywhere).
	Generation int64 `json:"generation"`
	// Blobs and Bytes count what was uploaded; blobs already there are not.
	Blobs int   `json:"blobs"`
	Bytes int64 `json:"bytes"`
	// History counts the history entries copied (point-in-time restore follows the space).
	History int `json:"history,omitempty"`
	// Skipped is set when the destination already had this generation or a newer one.
	Skipped bool `json:"skipped,omitempty"`
	// DestGeneration is the destination's generation when it was left alone.
	DestGeneration int64 `json:"dest_generation,omitempty"`
}

// CopySpace copies spaces/<host>/ (objects, then the manifest; never the lease) from src
// to dst. It refuses while the lease in src or dst is held by a live box (srcLive and
// dstLive judge the holders), leaves a destination with an equal or newer manifest
// generation alone, streams every blob through this box (the buckets differ, so a
// server-side copy cannot cross), and writes the manifest with compare-and-swap against
// what it read in dst. A source that changed during the copy (the space woke) fails
// after the blobs, before the manifest.
func CopySpace(ctx context.Context, src, dst bucket.Bucket, host string, srcLive, dstLive LiveFunc) (CopyResult, error) {
	var res CopyResult
	if err := checkAsleep(ctx, src, host, srcLive, "source"); err != nil {
		return res, err
	}
	if err := checkAsleep(ctx, dst, host, dstLive, "destination"); err != nil {
		return res, err
	}
	sm, setag, err := ReadManifest(ctx, src, host)
	if err != nil {
		return res, fmt.Errorf("source: %v", err)
	}
	dm, detag, err := ReadManifest(ctx, dst, host)
	if err != nil {
		return res, fmt.Errorf("destination: %v", err)
	}
	if sm == nil {
		if dm != nil {
			res.Skipped, res.Generation, res.DestGeneration = true, dm.Generation, dm.Generation
		}
		return res, nil
	}
	if dm != nil && dm.Generation >= sm.Generation {
		res.Skipped, res.Generation, res.DestGeneration = true, dm.Generation, dm.Generation
		return res, nil
	}
	// Every object the manifest references, whatever its kind: format-1 blobs, format-2
	// chunks, page-image bases and deltas.
	done := make(map[string]bool)
	for _, r := range sm.Refs() {
		n, copied, err := copyBlob(ctx, src, dst, RefKey(host, r), r.Size)
		if err != nil {
			return res, err
		}
		done[r.Key] = true
		if copied {
			res.Blobs++
			res.Bytes += n
		}
	}
	if err := copyHistory(ctx, src, dst, host, done, &res); err != nil {
		return res, err
	}
	// The source must still be the state just copied, and still asleep.
	if _, etag, err := ReadManifest(ctx, src, host); err != nil || etag != setag {
		return res, fmt.Errorf("%w: the source manifest changed during the copy (the space woke); re-run when it sleeps", ErrSpaceAwake)
	}
	if err := checkAsleep(ctx, src, host, srcLive, "source"); err != nil {
		return res, err
	}
	if _, err := WriteManifest(ctx, dst, host, sm, detag); err != nil {
		if errors.Is(err, ErrFenced) {
			return res, errors.New("the destination manifest changed during the copy; nothing was overwritten, re-run to compare again")
		}
		return res, fmt.Errorf("destination: %v", err)
	}
	res.Generation = sm.Generation
	return res, nil
}

// copyHistory copies the source's history entries, each after the objects it references
// (so a restore to a copied entry never misses one), so point-in-time restore follows a
// relocated space. A generation the destination already lists keeps its own entry. An entry
// the source's GC is expiring (it, or an object of it, gone) is left out, not an error.
func copyHistory(ctx context.Context, src, dst bucket.Bucket, host string, done map[string]bool, res *CopyResult) error {
	hist, _, err := History(ctx, src, host)
	if err != nil {
		return fmt.Errorf("source: %v", err)
	}
	have, _, err := History(ctx, dst, host)
	if err != nil {
		return fmt.Errorf("destination: %v", err)
	}
	gens := make(map[int64]bool)
	for _, cp := range have {
		gens[cp.Generation] = true
	}
entries:
	for _, cp := range hist {
		if gens[cp.Generation] {
			continue
		}
		m, err := readHistory(ctx, src, cp)
		if errors.Is(err, bucket.ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("source: %v", err)
		}
		for _, r := range m.Refs() {
			if done[r.Key] {
				continue
			}
			n, copied, err := copyBlob(ctx, src, dst, RefKey(host, r), r.Size)
			if err != nil {
				if _, herr := src.Head(ctx, RefKey(host, r)); errors.Is(herr, bucket.ErrNotFound) {
					continue entries // collected: the entry is past retention
				}
				return err
			}
			done[r.Key] = true
			if copied {
				res.Blobs++
				res.Bytes += n
			}
		}
		if err := WriteHistory(ctx, dst, host, m); err != nil {
			return fmt.Errorf("destination: %v", err)
		}
		gens[cp.Generation] = true
		res.History++
	}
	return nil
}

// AwakeError says where a space is awake: the live box holding its lease.
type AwakeError struct {
	Host string
	// Holder is the SELF (or box id) of the box the space is awake on.
	Holder string
	// Side names the bucket the lease was read in ("source", "destination"); empty
	// when there is only one.
	Side string
}

func (e *AwakeError) Error() string {
	if e.Side == "" {
		return fmt.Sprintf("%s is awake on %s", e.Host, e.Holder)
	}
	return fmt.Sprintf("%s is awake on %s (its lease in the %s bucket)", e.Host, e.Holder, e.Side)
}

// Unwrap makes an AwakeError an ErrSpaceAwake.
func (e *AwakeError) Unwrap() error { return ErrSpaceAwake }

// CheckAsleep fails with an *AwakeError (an ErrSpaceAwake) naming the holder when b's
// lease on host is held by a box live judges alive. A missing or released lease, or a
// dead holder's, is asleep.
func CheckAsleep(ctx context.Context, b bucket.Bucket, host string, live LiveFunc) error {
	return checkAsleep(ctx, b, host, live, "")
}

func checkAsleep(ctx context.Context, b bucket.Bucket, host string, live LiveFunc, side string) error {
	l, _, err := ReadLease(ctx, b, host)
	if errors.Is(err, bucket.ErrNotFound) {
		return nil
	}
	if err != nil {
		if side == "" {
			return fmt.Errorf("reading lease: %v", err)
		}
		return fmt.Errorf("%s: reading lease: %v", side, err)
	}
	if (Holder{Live: live}).Free(l) {
		return nil
	}
	return &AwakeError{Host: host, Holder: l.Holder, Side: side}
}

// copyBlob streams key from src to dst unless dst has it already with the same size
// (blobs are content-addressed: same key, same bytes).
func copyBlob(ctx context.Context, src, dst bucket.Bucket, key string, size int64) (int64, bool, error) {
	if info, err := dst.Head(ctx, key); err == nil && info.Size == size {
		return 0, false, nil
	} else if err != nil && !errors.Is(err, bucket.ErrNotFound) {
		return 0, false, fmt.Errorf("destination: %s: %v", key, err)
	}
	obj, err := src.Get(ctx, key)
	if err != nil {
		return 0, false, fmt.Errorf("source: %s: %v", key, err)
	}
	defer obj.Body.Close()
	if obj.Size != size {
		return 0, false, fmt.Errorf("source: %s is %d bytes, the manifest says %d", key, obj.Size, size)
	}
	if _, err := dst.Put(ctx, key, obj.Body, obj.Size, bucket.Cond{}); err != nil {
		return 0, false, fmt.Errorf("destination: %s: %v", key, err)
	}
	return obj.Size, true, nil
}

// Interface guards
var _ error = (*AwakeError)(nil)
