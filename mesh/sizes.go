package mesh

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// SizeKey is the bucket key of a space's size record, relative to the bucket's prefix:
// the memory its last wake took at its peak, and the box it ran on, written by that box when
// the space went to sleep. It is advisory (no lease guards it, the last writer wins):
// bounded-load placement reads it to know what a sleeping space adds to the box it wakes
// on, and keeps the space on the box it last woke on while that box has room (choose).
func SizeKey(host string) string { return "spaces/" + host + "/size" }

// SizeRecord is the body of a size record.
type SizeRecord struct {
	// Bytes is the space's peak memory during its last wake.
	Bytes int64 `json:"bytes"`
	// At is when it was written, by the writer's clock.
	At time.Time `json:"at"`
	// Box is the SELF of the box the space ran on in that wake; empty from a box that
	// does not name itself (an older box, or one outside a mesh).
	Box string `json:"box,omitempty"`
}

// DefaultSizeTTL is how long a size read from the bucket (or found missing) is used before
// it is read again.
const DefaultSizeTTL = 10 * time.Minute

// sizeReadTimeout bounds a size read on the request path; a slow bucket costs placement
// its knowledge of one size, not the request its latency.
const sizeReadTimeout = 500 * time.Millisecond

// Sizes remembers spaces' sizes, and the box each last woke on, on this box: measured here
// while a space is awake here (Note), read from its size record in the bucket otherwise
// (Get, once per TTL per host), and written to the bucket when a space this box ran goes
// to sleep (Save). Boxes whose copies of a record differ (one read it before the space's
// last sleep) may place its next wake differently; the lease decides, as for any two
// views.
type Sizes struct {
	// Self is this box's SELF, the box named in what it measures (Note) and writes
	// (Save). Empty: this box names none.
	Self string
	// Bucket holds the size records. Nil: sizes are known only from this box's own wakes.
	Bucket bucket.Bucket
	// TTL is how long a read size is used. Default DefaultSizeTTL.
	TTL time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time

	mu sync.Mutex
	m  map[string]sizeEntry
	// reads are the bucket reads in flight, so concurrent requests for one host wait on
	// one read.
	reads map[string]chan struct{}
}

type sizeEntry struct {
	bytes int64
	box   string
	until time.Time
}

func (s *Sizes) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Sizes) ttl() time.Duration {
	if s.TTL > 0 {
		return s.TTL
	}
	return DefaultSizeTTL
}

// Note records n bytes as host's size, measured on this box (so this box is where it
// last woke).
func (s *Sizes) Note(host string, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putLocked(host, n, s.Self)
}

func (s *Sizes) putLocked(host string, n int64, box string) {
	if s.m == nil {
		s.m = map[string]sizeEntry{}
	}
	s.m[host] = sizeEntry{bytes: n, box: box, until: s.now().Add(s.ttl())}
}

// Box is the box host's space last woke on as this box knows it (from Note, or from the
// record the last Get read, however old), "" when unknown. It reads no bucket: Get, on
// the same request, refreshed what it knows. It is Placement.Last.
func (s *Sizes) Box(host string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[host].box
}

// Get returns host's last known size: remembered while fresh, else read from its size
// record (one GET, bounded by a short timeout; concurrent callers share it). 0 means
// unknown (no record, or the read failed), which placement takes as the fleet's mean.
func (s *Sizes) Get(ctx context.Context, host string) int64 {
	for {
		s.mu.Lock()
		if e, ok := s.m[host]; ok && s.now().Before(e.until) {
			s.mu.Unlock()
			return e.bytes
		}
		if s.Bucket == nil {
			s.mu.Unlock()
			return 0
		}
		if wait, ok := s.reads[host]; ok {
			s.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return 0
			}
		}
		if s.reads == nil {
			s.reads = map[string]chan struct{}{}
		}
		done := make(chan struct{})
		s.reads[host] = done
		s.mu.Unlock()

		rctx, cancel := context.WithTimeout(ctx, sizeReadTimeout)
		rec, err := ReadSize(rctx, s.Bucket, host)
		cancel()
		s.mu.Lock()
		delete(s.reads, host)
		if err == nil || errors.Is(err, bucket.ErrNotFound) {
			s.putLocked(host, rec.Bytes, rec.Box)
		}
		s.mu.Unlock()
		close(done)
		return rec.Bytes
	}
}

// Save writes host's size record, naming this box, and remembers it here.
func (s *Sizes) Save(ctx context.Context, host string, n int64) error {
	s.Note(host, n)
	if s.Bucket == nil {
		return nil
	}
	body, err := json.Marshal(SizeRecord{Bytes: n, At: s.now().UTC(), Box: s.Self})
	if err != nil {
		return err
	}
	if _, err := s.Bucket.Put(ctx, SizeKey(host), bytes.NewReader(body), int64(len(body)), bucket.Cond{}); err != nil {
		return fmt.Errorf("writing size of %s: %v", host, err)
	}
	return nil
}

// Len is the number of sizes remembered, fresh or not.
func (s *Sizes) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// ReadSize reads host's size record. A missing record is bucket.ErrNotFound.
func ReadSize(ctx context.Context, b bucket.Bucket, host string) (SizeRecord, error) {
	obj, err := b.Get(ctx, SizeKey(host))
	if err != nil {
		return SizeRecord{}, err
	}
	defer obj.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(obj.Body, 4096))
	if err != nil {
		return SizeRecord{}, err
	}
	var rec SizeRecord
	if err := json.Unmarshal(raw, &rec); err != nil || rec.Bytes < 0 {
		return SizeRecord{}, fmt.Errorf("decoding size of %s: not a size record", host)
	}
	return rec, nil
}
