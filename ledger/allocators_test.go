package ledger

import (
	"context"
	"errors"
	"testing"

	"github.com/lchat/lchat-caddy/bucket/membucket"
)

func TestAllocatorsSeedAtLeast(t *testing.T) {
	ctx := context.Background()
	b := membucket.New()
	var ia Allocators
	// This box draws an id first: its block lies below the seeds that follow.
	a, err := ia.Get(b, "ids")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Next(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		min      uint64
		wantNext uint64
		wantErr  error
	}{
		{name: "zero refused", min: 0, wantErr: ErrSeedZero},
		{name: "raise above the block", min: 5000, wantNext: 5000},
		{name: "raise again", min: 7000, wantNext: 7000},
		{name: "lowering refused", min: 10, wantErr: ErrWouldLower},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, err := ia.SeedAtLeast(ctx, b, "ids", tc.min)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("SeedAtLeast(%d) = %d, %v; want %v", tc.min, next, err, tc.wantErr)
				}
				return
			}
			if err != nil || next != tc.wantNext {
				t.Fatalf("SeedAtLeast(%d) = %d, %v; want %d", tc.min, next, err, tc.wantNext)
			}
			// The old block was dropped: the next id is at least the seed.
			a, err := ia.Get(b, "ids")
			if err != nil {
				t.Fatal(err)
			}
			id, err := a.Next(ctx)
			if err != nil || id < tc.min {
				t.Fatalf("Next after seeding %d = %d, %v", tc.min, id, err)
			}
		})
	}
}

func TestAllocatorsSource(t *testing.T) {
	ctx := context.Background()
	b := membucket.New()
	dir := t.TempDir()
	var ia Allocators
	for _, tc := range []struct {
		name, namespace, wantName string
	}{
		{name: "shared ledger", namespace: "ids", wantName: "ledger ids"},
		{name: "local counter", namespace: "", wantName: "local counter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, name, err := ia.Source(b, tc.namespace, dir)
			if err != nil || name != tc.wantName {
				t.Fatalf("Source = %q, %v; want %q", name, err, tc.wantName)
			}
			again, _, _ := ia.Source(b, tc.namespace, dir)
			if again != src {
				t.Fatal("a second Source call made a new allocator: the rest of the block is lost")
			}
		})
	}
	// The local counter runs 1, 2, 3, and survives a new Allocators (a restart).
	src, _, _ := ia.Source(b, "", dir)
	for want := uint64(1); want <= 3; want++ {
		if id, err := src.Next(ctx); err != nil || id != want {
			t.Fatalf("local id = %d, %v; want %d", id, err, want)
		}
	}
	var restarted Allocators
	src, _, _ = restarted.Source(b, "", dir)
	if id, err := src.Next(ctx); err != nil || id != 4 {
		t.Fatalf("local id after restart = %d, %v; want 4", id, err)
	}
}
