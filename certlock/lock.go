// Package certlock is the lock protocol of the certificate storage (caddy.storage.lchat):
// named locks kept as objects in a bucket, so that boxes sharing the bucket never run two
// ACME orders for one name at once. A lock is created with If-None-Match, refreshed and
// taken over (once stale by the bucket's clock) with If-Match, and released by a delete
// with If-Match. It knows nothing of Caddy or certmagic: modules/certstorage hands a
// Locker to certmagic.
package certlock

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/internal/safego"
)

// Lock defaults.
const (
	// DefaultTTL is how long a lock stays valid without a refresh. A holder
	// refreshes well within it; a killed holder's lock is free this long after its
	// last refresh.
	DefaultTTL = 2 * time.Minute
	// DefaultPoll is how often a waiting Lock looks at a held lock again.
	DefaultPoll = time.Second
	// clockSlack covers the whole-second LastModified resolution of S3 (and of
	// HTTP dates), so a lock is never judged stale early by rounding.
	clockSlack = time.Second
)

// ErrLost means a held lock was taken over by another holder (its refresh or
// release lost a compare-and-swap), which only happens after it went unrefreshed
// past its TTL.
var ErrLost = errors.New("lock lost to another holder")

// ErrClosed means the Locker was closed: it takes no new locks.
var ErrClosed = errors.New("locker closed")

// lockBody is the content of a lock object. Staleness is judged on the bucket's
// clock (LastModified against the store's time) with TTL from the body, so the
// holder's own clock never matters; Expires is for operators reading the object.
type lockBody struct {
	Owner   string    `json:"owner"`
	TTLMS   int64     `json:"ttl_ms"`
	Expires time.Time `json:"expires"`
	// Seq counts refreshes. It makes every write's content, and so its ETag (a
	// content hash on S3), unique: a takeover's If-Match must not match a refresh
	// that happened after the staleness judgement.
	Seq int64 `json:"seq"`
	// Hold is random per acquisition. With Seq it makes every write's bytes this
	// holder's alone, so a holder recognises its own write whose answer was lost
	// (bucket.Landed).
	Hold string `json:"hold"`
}

func (l *Locker) body(hold string, seq int64) []byte {
	b, _ := json.Marshal(lockBody{Owner: l.Owner, TTLMS: l.ttl().Milliseconds(), Expires: time.Now().Add(l.ttl()).UTC(), Seq: seq, Hold: hold})
	return b
}

func newHold() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Locker is a set of named locks kept as objects in a bucket, one per name under
// Prefix. A lock is created with If-None-Match, refreshed and taken over with
// If-Match on its ETag, and released by a delete with If-Match, so at most one
// holder has it at a time across every process sharing the bucket.
type Locker struct {
	// Bucket holds the lock objects.
	Bucket bucket.Bucket
	// Prefix is prepended to every lock object key, e.g. "certs/locks/".
	Prefix string
	// Owner names this holder in lock bodies (never used for decisions).
	Owner string
	// TTL is a lock's validity without refresh. Default: DefaultTTL.
	TTL time.Duration
	// Refresh is the interval of a held lock's refresh. Default: TTL/4.
	Refresh time.Duration
	// Poll is how often a waiting Lock tries again. Default: DefaultPoll.
	Poll time.Duration
	// Logger receives refresh failures. Default: no logging.
	Logger *zap.Logger

	// mu guards held and closed.
	mu     sync.Mutex
	held   map[string]*heldLock
	closed bool
	// unsure maps a lock key to this Locker's last create of it whose outcome is
	// unknown (the store may have applied it and lost the answer).
	unsure map[string]sentCreate
}

// sentCreate is a lock create whose answer was lost: its hold and its exact bytes.
type sentCreate struct {
	hold string
	body []byte
}

// heldLock is one lock this Locker holds. Its refresher is the only writer of
// seq, unconfirmed, etag and lost after acquisition; Unlock reads them once the
// refresher stopped.
type heldLock struct {
	key  string
	hold string
	// seq is the Seq of the last refresh attempted.
	seq int64
	// unconfirmed holds the bodies of the refreshes attempted since the last one known
	// to have landed (etag is its ETag, or the create's): any of them may have landed
	// with its answer lost. It grows by one body per failed tick, so only while the
	// bucket stays unreachable.
	unconfirmed [][]byte
	etag        string
	lost        bool
	cancel      context.CancelFunc
	done        chan struct{}
}

func (l *Locker) ttl() time.Duration {
	if l.TTL > 0 {
		return l.TTL
	}
	return DefaultTTL
}

func (l *Locker) refresh() time.Duration {
	if l.Refresh > 0 {
		return l.Refresh
	}
	return l.ttl() / 4
}

func (l *Locker) poll() time.Duration {
	if l.Poll > 0 {
		return l.Poll
	}
	return DefaultPoll
}

func (l *Locker) logger() *zap.Logger {
	if l.Logger != nil {
		return l.Logger
	}
	return zap.NewNop()
}

// Key returns the bucket key of name's lock object.
func (l *Locker) Key(name string) string {
	return l.Prefix + url.PathEscape(name)
}

// Lock acquires name, waiting while another holder has it and its lock is fresh.
func (l *Locker) Lock(ctx context.Context, name string) error {
	for {
		ok, err := l.TryLock(ctx, name)
		if err != nil || ok {
			return err
		}
		t := time.NewTimer(l.poll())
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// TryLock makes one attempt at name: create the lock, or take over a stale one.
// It reports whether the lock is now held.
func (l *Locker) TryLock(ctx context.Context, name string) (bool, error) {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return false, fmt.Errorf("locking %s: %w", name, ErrClosed)
	}
	key := l.Key(name)
	hold := newHold()
	body := l.body(hold, 0)
	info, err := l.Bucket.Put(ctx, key, bytes.NewReader(body), int64(len(body)), bucket.Cond{IfNoneMatch: true})
	switch {
	case err == nil:
		l.start(key, name, hold, info.ETag)
		return true, nil
	case bucket.LostRace(err):
	default:
		l.mu.Lock()
		if l.unsure == nil {
			l.unsure = make(map[string]sentCreate)
		}
		l.unsure[key] = sentCreate{hold: hold, body: body}
		l.mu.Unlock()
		return false, fmt.Errorf("creating lock %s: %w", key, err)
	}
	// The lock exists. It may be this Locker's own earlier create whose answer was
	// lost: then it is held already, not someone else's to wait out.
	l.mu.Lock()
	prev, ok := l.unsure[key]
	delete(l.unsure, key)
	l.mu.Unlock()
	if ok {
		if etag, _, mine := bucket.Landed(ctx, l.Bucket, key, prev.body); mine {
			l.logger().Info("lock create whose answer was lost had landed; holding it", zap.String("lock", name))
			l.start(key, name, prev.hold, etag)
			return true, nil
		}
	}

	etag, stale, err := l.stale(ctx, key)
	if err != nil || !stale {
		return false, err
	}
	info, err = l.Bucket.Put(ctx, key, bytes.NewReader(body), int64(len(body)), bucket.Cond{IfMatch: etag})
	switch {
	case err == nil:
		l.logger().Info("took over stale lock", zap.String("lock", name))
		l.start(key, name, hold, info.ETag)
		return true, nil
	case bucket.LostRace(err):
		return false, nil // someone else refreshed, released or took it first
	default:
		return false, fmt.Errorf("taking over lock %s: %w", key, err)
	}
}

// stale reports whether the lock object at key has outlived its TTL by the
// bucket's clock, with the ETag that judgement is about. A missing lock is
// reported as not stale: the next create attempt will get it.
func (l *Locker) stale(ctx context.Context, key string) (etag string, stale bool, err error) {
	obj, err := l.Bucket.Get(ctx, key)
	if errors.Is(err, bucket.ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("reading lock %s: %w", key, err)
	}
	raw, err := io.ReadAll(io.LimitReader(obj.Body, 64<<10))
	obj.Body.Close()
	if err != nil {
		return "", false, fmt.Errorf("reading lock %s: %w", key, err)
	}
	ttl := l.ttl()
	var b lockBody
	if json.Unmarshal(raw, &b) == nil && b.TTLMS > 0 {
		ttl = time.Duration(b.TTLMS) * time.Millisecond
	}
	// The listing carries the store's own time, against which LastModified counts.
	page, err := l.Bucket.List(ctx, key, "")
	if err != nil {
		return "", false, fmt.Errorf("listing lock %s: %w", key, err)
	}
	for _, o := range page.Objects {
		if o.Key != key {
			continue
		}
		if o.ETag != obj.ETag {
			return "", false, nil // changed between the reads: look again later
		}
		return o.ETag, page.Now.Sub(o.LastModified) > ttl+clockSlack, nil
	}
	return "", false, nil
}

// start records a held lock and runs its refresher, unless the Locker was closed
// meanwhile: then the lock is only recorded, so that Unlock still releases it.
func (l *Locker) start(key, name, hold, etag string) {
	ctx, cancel := context.WithCancel(context.Background())
	h := &heldLock{key: key, hold: hold, etag: etag, cancel: cancel, done: make(chan struct{})}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == nil {
		l.held = map[string]*heldLock{}
	}
	l.held[name] = h
	if l.closed {
		cancel()
		close(h.done)
		return
	}
	go l.refresher(ctx, name, h)
}

// refresher rewrites a held lock every Refresh so its LastModified stays fresh.
// It is the only writer of h.seq, h.unconfirmed, h.etag and h.lost until it returns.
func (l *Locker) refresher(ctx context.Context, name string, h *heldLock) {
	defer close(h.done)
	safego.Run(l.logger().With(zap.String("lock", name)), "lock refresher", func() { l.refreshLoop(ctx, name, h) })
}

func (l *Locker) refreshLoop(ctx context.Context, name string, h *heldLock) {
	t := time.NewTicker(l.refresh())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.seq++
		body := l.body(h.hold, h.seq)
		h.unconfirmed = append(h.unconfirmed, body)
		// A hung request must not outlive its tick: the lock goes stale TTL after
		// the last refresh that landed, and the next tick has to get its chance.
		pctx, cancel := context.WithTimeout(ctx, l.refresh())
		info, err := l.Bucket.Put(pctx, h.key, bytes.NewReader(body), int64(len(body)), bucket.Cond{IfMatch: h.etag})
		cancel()
		switch {
		case err == nil:
			h.etag, h.unconfirmed = info.ETag, nil
		case ctx.Err() != nil:
			return
		case bucket.LostRace(err):
			if etag, ok := l.landed(ctx, h); ok {
				// An earlier refresh reported as failed reached the bucket after all.
				h.etag = etag
				continue
			}
			h.lost = true
			l.logger().Error("lock taken over by another holder while held", zap.String("lock", name))
			return
		default:
			// A transient failure: the lock stays ours until its TTL runs out, and
			// the next tick tries again.
			l.logger().Warn("refreshing lock", zap.String("lock", name), zap.Error(err))
		}
	}
}

// landed reports whether the lock object at h.key is one of h's own refreshes
// that was reported as failed (a timeout or a cut connection after the store
// applied the write), and its ETag. Then the lock is still held, under an ETag h
// never saw.
func (l *Locker) landed(ctx context.Context, h *heldLock) (string, bool) {
	ctx, cancel := context.WithTimeout(ctx, l.refresh())
	defer cancel()
	etag, _, ok := bucket.Landed(ctx, l.Bucket, h.key, h.unconfirmed...)
	return etag, ok
}

// Unlock releases name, which this Locker must hold. It also releases a lock
// held when the Locker was closed.
func (l *Locker) Unlock(ctx context.Context, name string) error {
	l.mu.Lock()
	h, ok := l.held[name]
	delete(l.held, name)
	l.mu.Unlock()
	if !ok {
		return fmt.Errorf("unlocking %s: not held", name)
	}
	h.cancel()
	<-h.done
	if h.lost {
		return fmt.Errorf("unlocking %s: %w", name, ErrLost)
	}
	err := l.Bucket.Delete(ctx, h.key, bucket.Cond{IfMatch: h.etag})
	if bucket.LostRace(err) {
		// The last refresh, cancelled or reported as failed, may have landed.
		if etag, ok := l.landed(ctx, h); ok {
			err = l.Bucket.Delete(ctx, h.key, bucket.Cond{IfMatch: etag})
		}
	}
	if bucket.LostRace(err) {
		return fmt.Errorf("unlocking %s: %w", name, ErrLost)
	}
	if err != nil {
		return fmt.Errorf("unlocking %s: %w", name, err)
	}
	return nil
}

// Close stops refreshing every held lock, and makes later TryLock and Lock calls
// fail with ErrClosed. Held locks stay recorded: their holders' Unlock (certmagic
// releases its locks when its cancelled work returns, and again at process exit)
// still deletes them, and a lock never released expires after its TTL, as a
// killed process's does. Close is idempotent.
func (l *Locker) Close() {
	l.mu.Lock()
	l.closed = true
	held := make([]*heldLock, 0, len(l.held))
	for _, h := range l.held {
		held = append(held, h)
	}
	l.mu.Unlock()
	for _, h := range held {
		h.cancel()
		<-h.done
	}
}
