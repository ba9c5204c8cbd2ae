package mesh_test

import (
	"context"
	"sync"
	"testing"

	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/ledger"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestLedgerVersityGW: 8 goroutines × 1000 ids over 3 allocators on one versitygw bucket,
// then a dropped allocator: every id unique, each allocator increasing, nothing reused.
func TestLedgerVersityGW(t *testing.T) {
	s3 := harness.StartS3(t)
	store := membucket.NewCounting(s3.NewBucket(t, "ledger-it"))
	ctx := context.Background()
	var as []*ledger.Allocator
	for i := 0; i < 3; i++ {
		a, err := ledger.New(store, "spaces", ledger.Options{})
		if err != nil {
			t.Fatal(err)
		}
		as = append(as, a)
	}
	var mu sync.Mutex
	seen := map[uint64]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(a *ledger.Allocator) {
			defer wg.Done()
			var prev uint64
			for i := 0; i < 1000; i++ {
				id, err := a.Next(ctx)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				dup := seen[id]
				seen[id] = true
				mu.Unlock()
				if dup || id <= prev {
					errs <- &dupError{id}
					return
				}
				prev = id
			}
		}(as[g%3])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != 8000 {
		t.Fatalf("%d ids", len(seen))
	}
	c := store.Counts()
	t.Logf("8000 ids over 3 allocators: %d PUTs (blocks of %d), %d GETs", c[membucket.OpPut], ledger.DefaultBlock, c[membucket.OpGet])

	// Drop an allocator mid-block (a crash); a new one never reuses its ids.
	crashed, _ := ledger.New(store, "spaces", ledger.Options{})
	id, err := crashed.Next(ctx)
	if err != nil || seen[id] {
		t.Fatalf("crashed allocator: %d, %v", id, err)
	}
	seen[id] = true
	fresh, _ := ledger.New(store, "spaces", ledger.Options{})
	for i := 0; i < 150; i++ {
		id, err := fresh.Next(ctx)
		if err != nil || seen[id] {
			t.Fatalf("after a crash: id %d (seen %v), %v", id, seen[id], err)
		}
		seen[id] = true
	}
}

type dupError struct{ id uint64 }

func (e *dupError) Error() string { return "id reused or out of order" }
