package ledger

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
)

// runConcurrent runs goroutines × perG Next calls spread over allocs allocators on b and
// checks every id is unique and each allocator's ids increase.
func runConcurrent(t testing.TB, b bucket.Bucket, ns string, allocs, goroutines, perG int, opts Options) map[uint64]bool {
	t.Helper()
	ctx := context.Background()
	var as []*Allocator
	for i := 0; i < allocs; i++ {
		a, err := New(b, ns, opts)
		if err != nil {
			t.Fatal(err)
		}
		as = append(as, a)
	}
	type got struct {
		alloc int
		ids   []uint64
	}
	results := make(chan got, goroutines)
	errs := make(chan error, goroutines)
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			a := g % allocs
			ids := make([]uint64, 0, perG)
			for i := 0; i < perG; i++ {
				id, err := as[a].Next(ctx)
				if err != nil {
					errs <- err
					return
				}
				ids = append(ids, id)
			}
			results <- got{a, ids}
		}(g)
	}
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for r := range results {
		for i, id := range r.ids {
			if seen[id] {
				t.Fatalf("id %d handed out twice", id)
			}
			seen[id] = true
			if i > 0 && id <= r.ids[i-1] {
				t.Fatalf("allocator %d went backwards: %d after %d", r.alloc, id, r.ids[i-1])
			}
		}
	}
	if len(seen) != goroutines*perG {
		t.Fatalf("%d ids, want %d", len(seen), goroutines*perG)
	}
	return seen
}

func TestConcurrentAllocatorsMemory(t *testing.T) {
	b := membucket.NewCounting(membucket.New())
	runConcurrent(t, b, "spaces", 3, 8, 1000, Options{})
	// 8000 ids in blocks of 100: 80 reservations, plus the lost races' retries.
	if puts := b.Counts()[membucket.OpPut]; puts < 80 || puts > 400 {
		t.Fatalf("%d writes for 8000 ids", puts)
	}
}

func TestConcurrentAllocatorsFileBucket(t *testing.T) {
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	runConcurrent(t, b, "spaces", 3, 8, 1000, Options{})
}

func TestCrashNeverReuses(t *testing.T) {
	ctx := context.Background()
	b := membucket.New()
	seen := map[uint64]bool{}
	take := func(a *Allocator, n int) {
		for i := 0; i < n; i++ {
			id, err := a.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if seen[id] {
				t.Fatalf("id %d reused", id)
			}
			seen[id] = true
		}
	}
	for crash := 0; crash < 5; crash++ {
		// A process takes a few ids and dies: its allocator (and its block) is dropped.
		a, _ := New(b, "spaces", Options{Block: 10})
		take(a, 3)
	}
	a, _ := New(b, "spaces", Options{Block: 10})
	take(a, 25)
	if cur, _ := Current(ctx, b, "spaces"); cur != 81 {
		t.Fatalf("counter at %d, want 81 after 8 blocks of 10", cur)
	}
	// A write that fails in flight wastes a block at most, never reuses one.
	c := membucket.NewCounting(b)
	fails := 1
	c.SetFail(func(ctx context.Context, op membucket.Op, key string) error {
		if op == membucket.OpPut && fails > 0 {
			fails--
			return errors.New("connection reset")
		}
		return nil
	})
	a2, _ := New(c, "spaces", Options{Block: 10})
	take(a2, 15)
}

func TestSeed(t *testing.T) {
	ctx := context.Background()
	b := membucket.New()
	if err := Seed(ctx, b, "spaces", 5000); err != nil {
		t.Fatal(err)
	}
	a, _ := New(b, "spaces", Options{})
	if id, _ := a.Next(ctx); id != 5001 {
		t.Fatalf("first id after seeding 5000 is %d", id)
	}
	if err := Seed(ctx, b, "spaces", 4000); !errors.Is(err, ErrWouldLower) {
		t.Fatalf("lowering: %v", err)
	}
	if err := Seed(ctx, b, "spaces", 5099); err == nil {
		// The block 5001..5100 is reserved: 5099 is below it.
		t.Fatal("seeded below a reserved block")
	}
	if err := Seed(ctx, b, "spaces", 5100); err != nil {
		t.Fatalf("seeding at the counter: %v", err)
	}
	if err := Seed(ctx, b, "spaces", 9000); err != nil {
		t.Fatal(err)
	}
	// The old allocator finishes its block, then jumps above the seed.
	for i := 0; i < 99; i++ {
		a.Next(ctx)
	}
	if id, _ := a.Next(ctx); id != 9001 {
		t.Fatalf("next block starts at %d, want 9001", id)
	}
	if cur, _ := Current(ctx, b, "fresh"); cur != 1 {
		t.Fatalf("fresh namespace at %d", cur)
	}
}

func TestCorruptCounterRefused(t *testing.T) {
	ctx := context.Background()
	b := membucket.New()
	b.Put(ctx, Key("spaces"), strings.NewReader(`{"nxt": 5}`), -1, bucket.Cond{})
	a, _ := New(b, "spaces", Options{})
	if _, err := a.Next(ctx); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("Next on a corrupt counter: %v", err)
	}
	for _, ns := range []string{"", "a/b", "..", strings.Repeat("x", 200)} {
		if _, err := New(b, ns, Options{}); err == nil {
			t.Errorf("namespace %q accepted", ns)
		}
	}
}

// TestJitterStaysUnderTheCurve: a compare-and-swap's wait after its nth lost race is
// random, above zero and at most casBackoff.After(n): 20ms, doubling, capped at 64 times.
func TestJitterStaysUnderTheCurve(t *testing.T) {
	for _, tc := range []struct {
		attempt int
		max     time.Duration
	}{{1, 20 * time.Millisecond}, {2, 40 * time.Millisecond}, {7, 1280 * time.Millisecond}, {30, 1280 * time.Millisecond}} {
		for range 200 {
			if d := jitter(casBackoff, tc.attempt); d <= 0 || d > tc.max {
				t.Fatalf("attempt %d waited %v, want in (0, %v]", tc.attempt, d, tc.max)
			}
		}
	}
	if c := casCurve(time.Millisecond); c.After(10) != 64*time.Millisecond {
		t.Fatalf("a 1ms RetryDelay caps at %v, want 64ms", c.After(10))
	}
}
