// Package ledger is the shared id counter: ledger/<namespace> in the bucket holds the next
// id not yet handed out to anyone, advanced by compare-and-swap in blocks. An Allocator
// reserves a whole block with one conditional write and then hands its ids out from
// memory, so a hundred ids cost about one bucket write. A reserved block is never handed
// out again, even when its allocator crashes before using it all: a crash only wastes
// the rest of that block. Ids are therefore unique across every allocator and process
// sharing the bucket, and increasing within one allocator.
package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/internal/backoff"
)

// DefaultBlock is how many ids one bucket write reserves.
const DefaultBlock = 100

// Compare-and-swap retry defaults, for an Allocator's Options and for Seed.
const (
	defaultMaxAttempts = 50
	defaultRetryDelay  = 20 * time.Millisecond
)

// casBackoff spaces the tries of a compare-and-swap on a counter that lost to another
// writer: each waits a random time below casBackoff.After(n) (full jitter), 20ms
// doubling to 64 times that. An Allocator's Options.RetryDelay scales it.
var casBackoff = backoff.Curve{First: defaultRetryDelay, Max: 64 * defaultRetryDelay}

// KeyPrefix is where counters live, relative to the bucket's prefix.
const KeyPrefix = "ledger/"

// ErrWouldLower is Seed's refusal to move a counter backwards.
var ErrWouldLower = errors.New("ledger: refusing to lower the counter")

// state is the counter object's body. Next is the lowest id no allocator has reserved;
// ids start at 1.
type state struct {
	Next uint64 `json:"next"`
}

// Key returns the bucket key of namespace's counter.
func Key(namespace string) string { return KeyPrefix + namespace }

func checkNamespace(ns string) error {
	if ns == "" || len(ns) > 128 {
		return fmt.Errorf("ledger: namespace must be 1-128 characters")
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') || ns == "." || ns == ".." {
			return fmt.Errorf("ledger: namespace %q: letters, digits, '.', '_' and '-' only", ns)
		}
	}
	return nil
}

// Options tune an Allocator.
type Options struct {
	// Block is how many ids one reservation takes. Default: DefaultBlock.
	Block uint64
	// MaxAttempts bounds the compare-and-swap retries of one reservation. Default: 50.
	MaxAttempts int
	// RetryDelay is the base of the jittered backoff between attempts. Default: 20ms.
	RetryDelay time.Duration
}

// Allocator hands out ids of one namespace. It is safe for concurrent use.
type Allocator struct {
	b    bucket.Bucket
	ns   string
	opts Options

	mu sync.Mutex
	// next and limit are the unused rest of the reserved block: [next, limit).
	next, limit uint64
	// writes counts successful reservations.
	writes uint64
	// recognized counts reservations won by a write whose answer was lost, recognized
	// by reading the write's own bytes back.
	recognized uint64
}

// New returns an Allocator for namespace. It touches the bucket only on the first Next.
func New(b bucket.Bucket, namespace string, opts Options) (*Allocator, error) {
	if err := checkNamespace(namespace); err != nil {
		return nil, err
	}
	if opts.Block == 0 {
		opts.Block = DefaultBlock
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = defaultMaxAttempts
	}
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = defaultRetryDelay
	}
	return &Allocator{b: b, ns: namespace, opts: opts}, nil
}

// Next returns an id no Next of any allocator on this bucket has returned or will return.
func (a *Allocator) Next(ctx context.Context) (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.next >= a.limit {
		start, err := a.reserveLocked(ctx)
		if err != nil {
			return 0, err
		}
		a.next, a.limit = start, start+a.opts.Block
		a.writes++
	}
	id := a.next
	a.next++
	return id, nil
}

// Reservations returns how many blocks this allocator has reserved (bucket writes made).
func (a *Allocator) Reservations() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.writes
}

// Recognized returns how many of this allocator's reservations were writes whose answer
// was lost (or whose retry failed its condition because the first try had landed),
// recognized as its own by their bytes instead of being skipped as another's win.
func (a *Allocator) Recognized() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.recognized
}

// reserveLocked advances the counter by one block with compare-and-swap and returns the
// block's first id. A lost race (412) or a store-reported conflict (409) re-reads and
// retries after a jittered backoff.
func (a *Allocator) reserveLocked(ctx context.Context) (uint64, error) {
	key := Key(a.ns)
	var lastErr error
	// sent holds every write of this reservation that did not come back as a success: one
	// may still have landed (its answer lost, or the SDK's retry of it failing its
	// condition because the first try landed). starts[i] is the first id of sent[i]'s block.
	var sent [][]byte
	var starts []uint64
	for attempt := 0; attempt < a.opts.MaxAttempts; attempt++ {
		if attempt > 0 {
			if err := sleep(ctx, jitter(casCurve(a.opts.RetryDelay), attempt)); err != nil {
				return 0, fmt.Errorf("ledger %s: reserving a block: %v", a.ns, err)
			}
		}
		if _, i, ok := bucket.Landed(ctx, a.b, key, sent...); ok {
			// Our own write (its nonce is ours alone): its block is ours, and nobody
			// else's since its condition held.
			a.recognized++
			return starts[i], nil
		}
		cur, etag, err := read(ctx, a.b, key)
		if err != nil {
			return 0, fmt.Errorf("ledger %s: reading counter: %v", a.ns, err)
		}
		if cur.Next > ^uint64(0)-a.opts.Block {
			return 0, fmt.Errorf("ledger %s: counter exhausted", a.ns)
		}
		body, err := encode(state{Next: cur.Next + a.opts.Block})
		if err != nil {
			return 0, err
		}
		err = put(ctx, a.b, key, body, etag)
		if err == nil {
			return cur.Next, nil
		}
		// A lost race retries. So does any other failure: the write may or may not have
		// landed, and either way the retry re-reads, so no block this allocator did not
		// win is ever used -- and a block it did win is recognized by its bytes.
		sent, starts = append(sent, body), append(starts, cur.Next)
		lastErr = err
		if !bucket.LostRace(err) && ctx.Err() != nil {
			break
		}
	}
	return 0, fmt.Errorf("ledger %s: reserving a block: gave up after %d attempts: %v", a.ns, a.opts.MaxAttempts, lastErr)
}

// casCurve is casBackoff starting at first (an Allocator's RetryDelay), capped at 64
// times it.
func casCurve(first time.Duration) backoff.Curve {
	return backoff.Curve{First: first, Max: 64 * first}
}

// jitter is a random wait of at most c.After(attempt) (full jitter).
func jitter(c backoff.Curve, attempt int) time.Duration {
	return time.Duration(rand.Int64N(int64(c.After(attempt))) + 1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// read returns the counter and its ETag; a missing counter is Next=1 with an empty ETag.
// A body that does not decode is an error, never a zero counter.
func read(ctx context.Context, b bucket.Bucket, key string) (state, string, error) {
	obj, err := b.Get(ctx, key)
	if errors.Is(err, bucket.ErrNotFound) {
		return state{Next: 1}, "", nil
	}
	if err != nil {
		return state{}, "", err
	}
	defer obj.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(obj.Body, 4096))
	if err != nil {
		return state{}, "", err
	}
	var s state
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil || s.Next == 0 {
		return state{}, "", fmt.Errorf("counter object %s is corrupt; refusing to guess its value", key)
	}
	if obj.ETag == "" {
		return state{}, "", fmt.Errorf("counter object %s has no ETag; the store cannot do compare-and-swap", key)
	}
	return s, obj.ETag, nil
}

// nonceBits is how many random bits each counter write carries.
const nonceBits = 64

// encode returns the counter object's bytes for s: its JSON, then a newline and a nonce
// of nonceBits random bits spelled in JSON whitespace (space for 0, tab for 1), then a
// newline. Whitespace after a value is valid JSON, so every decoder -- including a box
// that predates the nonce and refuses unknown fields -- reads the same counter; but no
// two writes have the same bytes (or the same MD5 ETag), so a writer that lost a write's
// answer recognizes its own write when it reads the counter back. A new field would have
// done the same, but older boxes reject unknown fields and would stop minting ids.
func encode(s state) ([]byte, error) {
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	n := rand.Uint64()
	raw = append(raw, '\n')
	for i := range nonceBits {
		if n>>i&1 == 1 {
			raw = append(raw, '\t')
		} else {
			raw = append(raw, ' ')
		}
	}
	return append(raw, '\n'), nil
}

// put stores body over the counter read with etag, or creates the counter when etag is
// empty (read found none); a lost race is one bucket.LostRace reports.
func put(ctx context.Context, b bucket.Bucket, key string, body []byte, etag string) error {
	cond := bucket.Cond{IfMatch: etag}
	if etag == "" {
		cond = bucket.Cond{IfNoneMatch: true}
	}
	_, err := b.Put(ctx, key, bytes.NewReader(body), int64(len(body)), cond)
	return err
}

// write stores s over the counter read with etag (see put).
func write(ctx context.Context, b bucket.Bucket, key string, s state, etag string) error {
	body, err := encode(s)
	if err != nil {
		return err
	}
	return put(ctx, b, key, body, etag)
}

// Current returns the lowest id not yet reserved in namespace (1 for a fresh one).
func Current(ctx context.Context, b bucket.Bucket, namespace string) (uint64, error) {
	if err := checkNamespace(namespace); err != nil {
		return 0, err
	}
	s, _, err := read(ctx, b, Key(namespace))
	if err != nil {
		return 0, fmt.Errorf("ledger %s: reading counter: %v", namespace, err)
	}
	return s.Next, nil
}

// Seed records that ids up to and including max are taken in namespace (ids minted before
// the ledger was switched on), so every later id is above it. Seeding to the counter's
// current position is a no-op; seeding below ids already reserved fails with
// ErrWouldLower and changes nothing.
func Seed(ctx context.Context, b bucket.Bucket, namespace string, max uint64) error {
	if err := checkNamespace(namespace); err != nil {
		return err
	}
	if max == ^uint64(0) {
		return fmt.Errorf("ledger %s: seed value out of range", namespace)
	}
	key := Key(namespace)
	want := max + 1
	for attempt := 0; attempt < defaultMaxAttempts; attempt++ {
		if attempt > 0 {
			if err := sleep(ctx, jitter(casBackoff, attempt)); err != nil {
				return fmt.Errorf("ledger %s: seeding: %v", namespace, err)
			}
		}
		cur, etag, err := read(ctx, b, key)
		if err != nil {
			return fmt.Errorf("ledger %s: reading counter: %v", namespace, err)
		}
		if etag != "" && cur.Next == want {
			return nil
		}
		if cur.Next > want {
			return fmt.Errorf("%w: %s already reserved ids up to %d, above the seed %d", ErrWouldLower, namespace, cur.Next-1, max)
		}
		err = write(ctx, b, key, state{Next: want}, etag)
		if err == nil {
			return nil
		}
		if !bucket.LostRace(err) {
			return fmt.Errorf("ledger %s: seeding: %v", namespace, err)
		}
	}
	return fmt.Errorf("ledger %s: seeding: too much contention", namespace)
}
