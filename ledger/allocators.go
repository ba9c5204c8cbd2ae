package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

// LocalNamespace is the counter of a box without a shared id ledger.
const LocalNamespace = "local"

// ErrSeedZero refuses a seed of 0: the lowest id handed out is at least 1.
var ErrSeedZero = errors.New("ledger: the seed must be at least 1")

// Allocators keeps one Allocator per namespace for as long as it lives, so a caller
// that outlives config reloads keeps the rest of each reserved block.
type Allocators struct {
	mu sync.Mutex
	m  map[string]*Allocator
	// local is the counter of minted ids without a shared ledger (Source).
	local *Allocator
}

// Get returns namespace's allocator on b, made on first use.
func (ia *Allocators) Get(b bucket.Bucket, namespace string) (*Allocator, error) {
	ia.mu.Lock()
	defer ia.mu.Unlock()
	if a, ok := ia.m[namespace]; ok {
		return a, nil
	}
	a, err := New(b, namespace, Options{})
	if err != nil {
		return nil, err
	}
	if ia.m == nil {
		ia.m = make(map[string]*Allocator)
	}
	ia.m[namespace] = a
	return a, nil
}

// Drop forgets namespace's allocator and the rest of its block.
func (ia *Allocators) Drop(namespace string) {
	ia.mu.Lock()
	defer ia.mu.Unlock()
	delete(ia.m, namespace)
}

// Source is where minted ids come from: with a namespace, the shared ledger in b
// (unique across every box on it); without one, a counter of this box alone in
// localDir, kept with the same ledger code one id per write (so local ids run 1, 2,
// 3 ...). It also names the source for messages.
func (ia *Allocators) Source(b bucket.Bucket, namespace, localDir string) (IDSource, string, error) {
	if namespace != "" {
		alloc, err := ia.Get(b, namespace)
		return alloc, "ledger " + namespace, err
	}
	ia.mu.Lock()
	defer ia.mu.Unlock()
	if ia.local == nil {
		fb, err := filebucket.New(localDir)
		if err != nil {
			return nil, "", fmt.Errorf("opening the local id counter %s: %v", localDir, err)
		}
		alloc, err := New(fb, LocalNamespace, Options{Block: 1})
		if err != nil {
			return nil, "", err
		}
		ia.local = alloc
	}
	return ia.local, "local counter", nil
}

// SeedAtLeast makes every id namespace hands out from now on at least min (ErrSeedZero
// for 0; ErrWouldLower, changing nothing, below the counter) and returns the lowest id
// it may hand out now. This box's reserved block may lie below the seed and is dropped;
// blocks other boxes reserved before the seed are theirs until used up (at most one
// block each), so seed a namespace before its boxes draw ids.
func (ia *Allocators) SeedAtLeast(ctx context.Context, b bucket.Bucket, namespace string, min uint64) (uint64, error) {
	if min == 0 {
		return 0, ErrSeedZero
	}
	if err := Seed(ctx, b, namespace, min-1); err != nil {
		return 0, err
	}
	ia.Drop(namespace)
	return Current(ctx, b, namespace)
}
