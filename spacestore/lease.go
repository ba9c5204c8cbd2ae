package spacestore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// Lease is the body of spaces/<host>/lease. Its validity is bound to the holder's heartbeat:
// a lease is free when released, or when (Holder, Incarnation) is not a live box. There are no
// renewal writes.
type Lease struct {
	Holder      string    `json:"holder"`
	Incarnation string    `json:"incarnation"`
	AcquiredAt  time.Time `json:"acquired_at"`
	Released    bool      `json:"released"`
}

// LeaseHeldError means a live other box holds the lease.
type LeaseHeldError struct {
	Host        string
	Holder      string
	Incarnation string
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("lease on %s held by %s", e.Host, e.Holder)
}

// ErrLeaseLost means the lease object changed since this box wrote it: another box took it over.
var ErrLeaseLost = errors.New("lease taken over by another holder")

// LiveFunc reports whether a lease holder (holder, incarnation) is alive.
type LiveFunc func(holder, incarnation string) bool

// Holder identifies this box in leases.
type Holder struct {
	ID          string
	Incarnation string
	// Live reports whether another holder is alive; nil means a single box, where only
	// this box's own current incarnation counts as live.
	Live LiveFunc
	// OnTakeover, when set, hears of every lease taken over from another holder (or an
	// earlier incarnation) that had not released it, with that lease: for the log.
	OnTakeover func(host string, prev Lease)
}

// Free reports whether l may be taken by h.
func (h Holder) Free(l Lease) bool {
	if l.Released {
		return true
	}
	if l.Holder == h.ID && l.Incarnation == h.Incarnation {
		return true
	}
	if h.Live == nil {
		// A single box: only this box's own current incarnation is live, handled above.
		return true
	}
	return !h.Live(l.Holder, l.Incarnation)
}

// ReadLease reads a space's lease and its ETag.
func ReadLease(ctx context.Context, b bucket.Bucket, host string) (Lease, string, error) {
	var l Lease
	etag, err := getJSON(ctx, b, LeaseKey(host), &l)
	return l, etag, err
}

// AcquireLease takes the lease of host for h: created with If-None-Match when absent, taken
// over with If-Match on its ETag when free. It returns the lease's new ETag, or a
// *LeaseHeldError when a live other box holds it.
func AcquireLease(ctx context.Context, b bucket.Bucket, host string, h Holder, now time.Time) (string, error) {
	return AcquireLeaseAfter(ctx, b, host, h, now, "")
}

// AcquireLeaseAfter is AcquireLease for a holder that released the lease itself and kept
// the ETag ReleaseLease returned: while nobody wrote the lease since, that release is the
// lease, free for h, and one write conditioned on its ETag takes it (a wake on the box the
// space slept on: one request instead of a failed create, a read and a swap). Otherwise,
// or with released "", it is AcquireLease.
func AcquireLeaseAfter(ctx context.Context, b bucket.Bucket, host string, h Holder, now time.Time, released string) (string, error) {
	body, err := json.Marshal(Lease{Holder: h.ID, Incarnation: h.Incarnation, AcquiredAt: now.UTC()})
	if err != nil {
		return "", err
	}
	if released != "" {
		info, err := b.Put(ctx, LeaseKey(host), bytes.NewReader(body), int64(len(body)), bucket.Cond{IfMatch: released})
		if err == nil {
			return info.ETag, nil
		}
		if !bucket.LostRace(err) {
			return "", fmt.Errorf("taking the released lease: %w", err)
		}
		// Written since: look at it.
	}
	var lastErr error
	for attempt := 0; attempt < 8; attempt++ {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		info, err := b.Put(ctx, LeaseKey(host), bytes.NewReader(body), int64(len(body)), bucket.Cond{IfNoneMatch: true})
		if err == nil {
			return info.ETag, nil
		}
		if !bucket.LostRace(err) {
			return "", fmt.Errorf("creating lease: %w", err)
		}
		cur, etag, err := ReadLease(ctx, b, host)
		if errors.Is(err, bucket.ErrNotFound) {
			continue // deleted meanwhile: create again
		}
		if err != nil {
			return "", fmt.Errorf("reading lease: %w", err)
		}
		if !h.Free(cur) {
			return "", &LeaseHeldError{Host: host, Holder: cur.Holder, Incarnation: cur.Incarnation}
		}
		info, err = b.Put(ctx, LeaseKey(host), bytes.NewReader(body), int64(len(body)), bucket.Cond{IfMatch: etag})
		if err == nil {
			if h.OnTakeover != nil && !cur.Released && (cur.Holder != h.ID || cur.Incarnation != h.Incarnation) {
				h.OnTakeover(host, cur)
			}
			return info.ETag, nil
		}
		if !bucket.LostRace(err) {
			return "", fmt.Errorf("taking over lease: %w", err)
		}
		lastErr = err // someone else raced us: look again
	}
	return "", fmt.Errorf("acquiring lease: too much contention: %w", lastErr)
}

// ReleaseLease marks the lease released with If-Match on etag, the ETag this box got when it
// acquired it, and returns the released lease's ETag (for AcquireLeaseAfter). ErrLeaseLost
// means another box took it over meanwhile (nothing was written).
func ReleaseLease(ctx context.Context, b bucket.Bucket, host, etag string, h Holder, now time.Time) (string, error) {
	body, err := json.Marshal(Lease{Holder: h.ID, Incarnation: h.Incarnation, AcquiredAt: now.UTC(), Released: true})
	if err != nil {
		return "", err
	}
	info, err := b.Put(ctx, LeaseKey(host), bytes.NewReader(body), int64(len(body)), bucket.Cond{IfMatch: etag})
	if bucket.LostRace(err) {
		if cur, _, ok := bucket.Landed(ctx, b, LeaseKey(host), body); ok {
			return cur, nil // this release landed; its answer was lost
		}
		return "", ErrLeaseLost
	}
	if err != nil {
		return "", fmt.Errorf("releasing lease: %w", err)
	}
	return info.ETag, nil
}

// StillHeld reports whether the lease is still exactly the one this box wrote (same ETag,
// not released, this holder and incarnation).
func StillHeld(ctx context.Context, b bucket.Bucket, host, etag string, h Holder) (bool, error) {
	l, cur, err := ReadLease(ctx, b, host)
	if errors.Is(err, bucket.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return cur == etag && !l.Released && l.Holder == h.ID && l.Incarnation == h.Incarnation, nil
}

// maxJSON bounds the control objects (lease, manifest, wake records) read into memory.
const maxJSON = 64 << 20

func getJSON(ctx context.Context, b bucket.Bucket, key string, v any) (string, error) {
	obj, err := b.Get(ctx, key)
	if err != nil {
		return "", err
	}
	defer obj.Body.Close()
	data, err := io.ReadAll(io.LimitReader(obj.Body, maxJSON))
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", key, err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return "", fmt.Errorf("decoding %s: %w", key, err)
	}
	return obj.ETag, nil
}

// Interface guards
var _ error = (*LeaseHeldError)(nil)
