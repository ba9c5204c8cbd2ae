// Package buckettest is the conformance suite every bucket.Bucket backend runs: the
// semantics leases, manifests and heartbeats depend on, including the conditional-write
// races, pagination, the store clock and streaming of large objects.
package buckettest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// Option changes what Run expects of a backend.
type Option func(*options)

type options struct {
	holdsObjects bool
}

// HoldsObjects is for a backend whose store is the process's memory: it cannot stream a
// put past its heap, so the large-object test keeps to 12 MiB and does not bound the
// heap during puts. Gets must still stream.
func HoldsObjects() Option { return func(o *options) { o.holdsObjects = true } }

// Racers is the number of concurrent writers in each conditional race.
const Racers = 32

// Run runs the suite. newBucket returns an empty bucket; it is called once per subtest,
// so backends may share one server across calls as long as each bucket starts empty
// (for example by handing out a fresh prefix).
func Run(t *testing.T, newBucket func(t *testing.T) bucket.Bucket, opts ...Option) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, b bucket.Bucket)
	}{
		{"PutGetHead", testPutGetHead},
		{"NotFound", testNotFound},
		{"InvalidKeys", testInvalidKeys},
		{"Overwrite", testOverwrite},
		{"IfNoneMatch", testIfNoneMatch},
		{"IfMatch", testIfMatch},
		{"IfMatchMissing", testIfMatchMissing},
		{"Delete", testDelete},
		{"DeleteIfMatch", testDeleteIfMatch},
		{"Copy", testCopy},
		{"List", testList},
		{"ListPagination", testListPagination},
		{"StoreClock", testStoreClock},
		{"UnknownSize", testUnknownSize},
		{"WrongSize", testWrongSize},
		{"RaceCreate", testRaceCreate},
		{"RaceSwap", testRaceSwap},
		{"LargeObject", func(t *testing.T, b bucket.Bucket) { testLargeObject(t, b, o) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newBucket(t))
		})
	}
}

func put(t *testing.T, b bucket.Bucket, key, body string, cond bucket.Cond) (bucket.Info, error) {
	t.Helper()
	return b.Put(context.Background(), key, strings.NewReader(body), int64(len(body)), cond)
}

func mustPut(t *testing.T, b bucket.Bucket, key, body string) bucket.Info {
	t.Helper()
	info, err := put(t, b, key, body, bucket.Cond{})
	if err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
	return info
}

func mustGet(t *testing.T, b bucket.Bucket, key string) (bucket.Info, string) {
	t.Helper()
	obj, err := b.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	defer obj.Body.Close()
	data, err := io.ReadAll(obj.Body)
	if err != nil {
		t.Fatalf("reading %q: %v", key, err)
	}
	return obj.Info, string(data)
}

func testPutGetHead(t *testing.T, b bucket.Bucket) {
	before := time.Now()
	info, err := put(t, b, "dir/sub/obj.json", `{"a":1}`, bucket.Cond{})
	if err != nil {
		t.Fatal(err)
	}
	if info.ETag == "" || info.Key != "dir/sub/obj.json" || info.Size != 7 {
		t.Fatalf("Put returned %+v", info)
	}
	got, body := mustGet(t, b, "dir/sub/obj.json")
	if body != `{"a":1}` {
		t.Fatalf("Get body = %q", body)
	}
	if got.ETag != info.ETag || got.Size != 7 || got.Key != "dir/sub/obj.json" {
		t.Fatalf("Get info %+v, Put info %+v", got, info)
	}
	if !strings.HasPrefix(got.ETag, `"`) || !strings.HasSuffix(got.ETag, `"`) {
		t.Errorf("ETag %s is not quoted like S3's", got.ETag)
	}
	// Stores keep LastModified at second resolution; allow for it and for clock skew.
	if got.LastModified.Before(before.Add(-5*time.Second)) || got.LastModified.After(time.Now().Add(5*time.Second)) {
		t.Errorf("LastModified %v, written at %v", got.LastModified, before)
	}
	head, err := b.Head(context.Background(), "dir/sub/obj.json")
	if err != nil {
		t.Fatal(err)
	}
	if head.ETag != info.ETag || head.Size != 7 || !head.LastModified.Equal(got.LastModified) {
		t.Fatalf("Head %+v, Get %+v", head, got)
	}
	// The empty object is an object.
	if _, err := put(t, b, "empty", "", bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	if info, body := mustGet(t, b, "empty"); body != "" || info.Size != 0 {
		t.Fatalf("empty object: %+v %q", info, body)
	}
	if b.String() == "" {
		t.Error("String() is empty")
	}
}

func testNotFound(t *testing.T, b bucket.Bucket) {
	ctx := context.Background()
	if _, err := b.Get(ctx, "missing"); !errors.Is(err, bucket.ErrNotFound) {
		t.Errorf("Get(missing) = %v, want ErrNotFound", err)
	}
	if _, err := b.Head(ctx, "missing"); !errors.Is(err, bucket.ErrNotFound) {
		t.Errorf("Head(missing) = %v, want ErrNotFound", err)
	}
	if _, err := b.Copy(ctx, "missing", "dst"); !errors.Is(err, bucket.ErrNotFound) {
		t.Errorf("Copy(missing) = %v, want ErrNotFound", err)
	}
	mustPut(t, b, "a/b", "x")
	// A prefix of a key is not a key.
	if _, err := b.Head(ctx, "a"); !errors.Is(err, bucket.ErrNotFound) {
		t.Errorf("Head(a) with only a/b stored = %v, want ErrNotFound", err)
	}
}

func testInvalidKeys(t *testing.T, b bucket.Bucket) {
	for _, key := range []string{"", "/abs", "a//b", "a/../b", "..", "a/", "./a"} {
		if _, err := put(t, b, key, "x", bucket.Cond{}); !errors.Is(err, bucket.ErrInvalidKey) {
			t.Errorf("Put(%q) = %v, want ErrInvalidKey", key, err)
		}
		if _, err := b.Get(context.Background(), key); !errors.Is(err, bucket.ErrInvalidKey) {
			t.Errorf("Get(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
	if _, err := b.List(context.Background(), "../x", ""); !errors.Is(err, bucket.ErrInvalidKey) {
		t.Errorf("List(../x) = %v, want ErrInvalidKey", err)
	}
}

func testOverwrite(t *testing.T, b bucket.Bucket) {
	first := mustPut(t, b, "k", "one")
	second := mustPut(t, b, "k", "two")
	if first.ETag == second.ETag {
		t.Fatalf("different content, same ETag %s", first.ETag)
	}
	same := mustPut(t, b, "k2", "two")
	if info, body := mustGet(t, b, "k"); body != "two" || info.ETag != second.ETag {
		t.Fatalf("after overwrite: %+v %q", info, body)
	}
	// ETags are content hashes for single-part objects on both backends.
	if same.ETag != second.ETag {
		t.Errorf("same content under two keys: ETags %s and %s", same.ETag, second.ETag)
	}
}

func testIfNoneMatch(t *testing.T, b bucket.Bucket) {
	info, err := put(t, b, "lease", "mine", bucket.Cond{IfNoneMatch: true})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := put(t, b, "lease", "theirs", bucket.Cond{IfNoneMatch: true}); !errors.Is(err, bucket.ErrPreconditionFailed) {
		t.Fatalf("second create = %v, want ErrPreconditionFailed", err)
	}
	if got, body := mustGet(t, b, "lease"); body != "mine" || got.ETag != info.ETag {
		t.Fatalf("losing create changed the object: %q", body)
	}
	// After a delete the key can be created again.
	if err := b.Delete(context.Background(), "lease", bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	if _, err := put(t, b, "lease", "again", bucket.Cond{IfNoneMatch: true}); err != nil {
		t.Fatalf("create after delete: %v", err)
	}
}

func testIfMatch(t *testing.T, b bucket.Bucket) {
	v1 := mustPut(t, b, "manifest", "gen1")
	v2, err := put(t, b, "manifest", "gen2", bucket.Cond{IfMatch: v1.ETag})
	if err != nil {
		t.Fatalf("swap from current ETag: %v", err)
	}
	if _, err := put(t, b, "manifest", "gen2-stale", bucket.Cond{IfMatch: v1.ETag}); !errors.Is(err, bucket.ErrPreconditionFailed) {
		t.Fatalf("swap from stale ETag = %v, want ErrPreconditionFailed", err)
	}
	if got, body := mustGet(t, b, "manifest"); body != "gen2" || got.ETag != v2.ETag {
		t.Fatalf("after stale swap: %q %s", body, got.ETag)
	}
	// The ETag from Head and from List work for If-Match too.
	head, err := b.Head(context.Background(), "manifest")
	if err != nil {
		t.Fatal(err)
	}
	v3, err := put(t, b, "manifest", "gen3", bucket.Cond{IfMatch: head.ETag})
	if err != nil {
		t.Fatalf("swap from Head ETag: %v", err)
	}
	page, err := b.List(context.Background(), "manifest", "")
	if err != nil || len(page.Objects) != 1 {
		t.Fatalf("List: %v %+v", err, page)
	}
	if page.Objects[0].ETag != v3.ETag {
		t.Fatalf("List ETag %s, Put ETag %s", page.Objects[0].ETag, v3.ETag)
	}
	if _, err := put(t, b, "manifest", "gen4", bucket.Cond{IfMatch: page.Objects[0].ETag}); err != nil {
		t.Fatalf("swap from List ETag: %v", err)
	}
}

func testIfMatchMissing(t *testing.T, b bucket.Bucket) {
	if _, err := put(t, b, "nothing-here", "x", bucket.Cond{IfMatch: `"0123456789abcdef0123456789abcdef"`}); !errors.Is(err, bucket.ErrPreconditionFailed) {
		t.Fatalf("If-Match put on a missing key = %v, want ErrPreconditionFailed", err)
	}
	if _, err := b.Head(context.Background(), "nothing-here"); !errors.Is(err, bucket.ErrNotFound) {
		t.Fatalf("failed If-Match put created the key: %v", err)
	}
}

func testDelete(t *testing.T, b bucket.Bucket) {
	ctx := context.Background()
	mustPut(t, b, "d/x", "1")
	mustPut(t, b, "d/y", "2")
	if err := b.Delete(ctx, "d/x", bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Head(ctx, "d/x"); !errors.Is(err, bucket.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if _, body := mustGet(t, b, "d/y"); body != "2" {
		t.Fatal("delete removed a sibling")
	}
	if err := b.Delete(ctx, "d/x", bucket.Cond{}); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	if err := b.Delete(ctx, "d/y", bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	// With every key under d/ gone, d itself can be a key.
	mustPut(t, b, "d", "now a key")
	if page, err := b.List(ctx, "", ""); err != nil || len(page.Objects) != 1 || page.Objects[0].Key != "d" {
		t.Fatalf("List after deletes: %v %+v", err, page.Objects)
	}
}

func testDeleteIfMatch(t *testing.T, b bucket.Bucket) {
	ctx := context.Background()
	v1 := mustPut(t, b, "lease", "holder-a")
	v2 := mustPut(t, b, "lease", "holder-b")
	if err := b.Delete(ctx, "lease", bucket.Cond{IfMatch: v1.ETag}); !errors.Is(err, bucket.ErrPreconditionFailed) {
		t.Fatalf("delete with stale ETag = %v, want ErrPreconditionFailed", err)
	}
	if _, body := mustGet(t, b, "lease"); body != "holder-b" {
		t.Fatal("stale conditional delete removed the object")
	}
	if err := b.Delete(ctx, "lease", bucket.Cond{IfMatch: v2.ETag}); err != nil {
		t.Fatalf("delete with current ETag: %v", err)
	}
	if _, err := b.Head(ctx, "lease"); !errors.Is(err, bucket.ErrNotFound) {
		t.Fatalf("after conditional delete: %v", err)
	}
	if err := b.Delete(ctx, "lease", bucket.Cond{IfMatch: v2.ETag}); !errors.Is(err, bucket.ErrPreconditionFailed) {
		t.Fatalf("conditional delete of a missing key = %v, want ErrPreconditionFailed", err)
	}
}

func testCopy(t *testing.T, b bucket.Bucket) {
	src := mustPut(t, b, "spaces/a/blobs/1", "content")
	info, err := b.Copy(context.Background(), "spaces/a/blobs/1", "spaces/b/blobs/1")
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != "spaces/b/blobs/1" || info.ETag != src.ETag || info.Size != src.Size {
		t.Fatalf("Copy returned %+v, source %+v", info, src)
	}
	if _, body := mustGet(t, b, "spaces/b/blobs/1"); body != "content" {
		t.Fatalf("copy body %q", body)
	}
	if _, body := mustGet(t, b, "spaces/a/blobs/1"); body != "content" {
		t.Fatal("copy changed the source")
	}
}

func listAll(t *testing.T, b bucket.Bucket, prefix string) ([]bucket.Info, int) {
	t.Helper()
	var all []bucket.Info
	token, pages := "", 0
	for {
		page, err := b.List(context.Background(), prefix, token)
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		pages++
		if len(page.Objects) > 1000 {
			t.Fatalf("page of %d objects, more than 1000", len(page.Objects))
		}
		all = append(all, page.Objects...)
		if page.NextToken == "" {
			return all, pages
		}
		if pages > 100 {
			t.Fatal("listing does not end")
		}
		token = page.NextToken
	}
}

func keys(infos []bucket.Info) []string {
	var ks []string
	for _, i := range infos {
		ks = append(ks, i.Key)
	}
	return ks
}

func testList(t *testing.T, b bucket.Bucket) {
	stored := []string{"mesh/members/b", "mesh/members/a", "mesh/other", "mesh-x", "spaces/h1/lease", "spaces/h1/blobs/00", "spaces/h10/lease", "z"}
	for _, k := range stored {
		mustPut(t, b, k, k)
	}
	cases := map[string][]string{
		"":              {"mesh-x", "mesh/members/a", "mesh/members/b", "mesh/other", "spaces/h1/blobs/00", "spaces/h1/lease", "spaces/h10/lease", "z"},
		"mesh/":         {"mesh/members/a", "mesh/members/b", "mesh/other"},
		"mesh/members/": {"mesh/members/a", "mesh/members/b"},
		"mesh":          {"mesh-x", "mesh/members/a", "mesh/members/b", "mesh/other"},
		"spaces/h1":     {"spaces/h1/blobs/00", "spaces/h1/lease", "spaces/h10/lease"},
		"spaces/h1/":    {"spaces/h1/blobs/00", "spaces/h1/lease"},
		"nothing/":      nil,
	}
	for prefix, want := range cases {
		got, _ := listAll(t, b, prefix)
		if fmt.Sprint(keys(got)) != fmt.Sprint(want) {
			t.Errorf("List(%q) = %v, want %v", prefix, keys(got), want)
		}
		for _, info := range got {
			if info.Size != int64(len(info.Key)) || info.ETag == "" || info.LastModified.IsZero() {
				t.Errorf("List(%q): %+v lacks size, ETag or LastModified", prefix, info)
			}
		}
	}
}

// putMany stores n small objects with a few concurrent writers.
func putMany(t *testing.T, b bucket.Bucket, keys []string) {
	t.Helper()
	var wg sync.WaitGroup
	work := make(chan string)
	errs := make(chan error, len(keys))
	for range 16 {
		wg.Go(func() {
			for k := range work {
				if _, err := b.Put(context.Background(), k, strings.NewReader("x"), 1, bucket.Cond{}); err != nil {
					errs <- err
				}
			}
		})
	}
	for _, k := range keys {
		work <- k
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func testListPagination(t *testing.T, b bucket.Bucket) {
	const n = 1234
	var want []string
	for i := range n {
		// Nested and flat keys mixed, so pages cut across directories.
		if i%3 == 0 {
			want = append(want, fmt.Sprintf("p/%04d/x", i))
		} else {
			want = append(want, fmt.Sprintf("p/%04d", i))
		}
	}
	mustPut(t, b, "q/outside", "x")
	putMany(t, b, want)
	sort.Strings(want)
	got, pages := listAll(t, b, "p/")
	if pages < 2 {
		t.Errorf("%d keys listed in %d page(s); want pagination past 1000", n, pages)
	}
	if fmt.Sprint(keys(got)) != fmt.Sprint(want) {
		gk := keys(got)
		t.Fatalf("paginated listing: got %d keys, want %d (first got %v)", len(gk), len(want), gk[:min(5, len(gk))])
	}
}

func testStoreClock(t *testing.T, b bucket.Bucket) {
	mustPut(t, b, "mesh/members/self", "{}")
	page, err := b.List(context.Background(), "mesh/members/", "")
	if err != nil {
		t.Fatal(err)
	}
	if page.Now.IsZero() || len(page.Objects) != 1 {
		t.Fatalf("List: Now=%v objects=%d", page.Now, len(page.Objects))
	}
	// Liveness compares these two, both from the store's clock.
	age := page.Now.Sub(page.Objects[0].LastModified)
	if age < -2*time.Second || age > 5*time.Second {
		t.Fatalf("a just-written key is %v old by the store clock (Now %v, LastModified %v)", age, page.Now, page.Objects[0].LastModified)
	}
}

func testUnknownSize(t *testing.T, b bucket.Bucket) {
	body := strings.Repeat("unknown size ", 1000)
	info, err := b.Put(context.Background(), "u", io.MultiReader(strings.NewReader(body)), -1, bucket.Cond{IfNoneMatch: true})
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(len(body)) {
		t.Errorf("Put size %d, want %d", info.Size, len(body))
	}
	if _, got := mustGet(t, b, "u"); got != body {
		t.Fatal("unknown-size body differs")
	}
}

// testWrongSize: a body that is not the announced size fails the put and stores
// nothing, for small bodies and for ones large enough to go in parts.
func testWrongSize(t *testing.T, b bucket.Bucket) {
	ctx := context.Background()
	before := mustPut(t, b, "existing", "keep me")
	for _, n := range []int64{1 << 10, 12 << 20} {
		for _, tc := range []struct {
			name     string
			declared int64
		}{{"short", n + 1}, {"long", n - 1}} {
			for _, key := range []string{"new", "existing"} {
				_, err := b.Put(ctx, key, &genReader{rand.NewChaCha8([32]byte{9}), n}, tc.declared, bucket.Cond{})
				if err == nil {
					t.Errorf("Put of %d bytes declared as %d (%s body) to %s succeeded", n, tc.declared, tc.name, key)
				}
			}
			if _, err := b.Head(ctx, "new"); !errors.Is(err, bucket.ErrNotFound) {
				t.Errorf("a %s %d-byte body was stored anyway: Head = %v", tc.name, n, err)
			}
			if info, body := mustGet(t, b, "existing"); body != "keep me" || info.ETag != before.ETag {
				t.Errorf("a %s %d-byte body replaced an object: %d bytes now", tc.name, n, info.Size)
			}
		}
	}
}

// race runs Racers concurrent attempts released together. A conflicted attempt (409,
// "retry me") is retried: S3 allows a store to refuse every concurrent writer, and what
// a lease needs is that no more than one attempt ever succeeds, and one can.
func race(t *testing.T, attempt func(i int) error) (winners []int) {
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		mu    sync.Mutex
	)
	var conflicts atomic.Int64
	for i := range Racers {
		wg.Go(func() {
			<-start
			for try := 0; ; try++ {
				err := attempt(i)
				switch {
				case err == nil:
					mu.Lock()
					winners = append(winners, i)
					mu.Unlock()
				case errors.Is(err, bucket.ErrConflict) && try < 10:
					conflicts.Add(1)
					continue
				case errors.Is(err, bucket.ErrPreconditionFailed), errors.Is(err, bucket.ErrConflict):
				default:
					t.Errorf("racer %d: %v (want success, ErrPreconditionFailed or ErrConflict)", i, err)
				}
				return
			}
		})
	}
	close(start)
	wg.Wait()
	if c := conflicts.Load(); c > 0 {
		t.Logf("%d conflicted attempts retried", c)
	}
	return winners
}

func testRaceCreate(t *testing.T, b bucket.Bucket) {
	for round := range 3 {
		key := fmt.Sprintf("spaces/h/lease-%d", round)
		winners := race(t, func(i int) error {
			_, err := put(t, b, key, fmt.Sprintf("racer %d", i), bucket.Cond{IfNoneMatch: true})
			return err
		})
		if len(winners) != 1 {
			t.Fatalf("round %d: %d of %d If-None-Match creates succeeded, want exactly 1", round, len(winners), Racers)
		}
		if _, body := mustGet(t, b, key); body != fmt.Sprintf("racer %d", winners[0]) {
			t.Fatalf("round %d: winner %d, stored %q", round, winners[0], body)
		}
	}
}

func testRaceSwap(t *testing.T, b bucket.Bucket) {
	for round := range 3 {
		key := fmt.Sprintf("spaces/h/manifest-%d", round)
		base := mustPut(t, b, key, "generation 0")
		winners := race(t, func(i int) error {
			_, err := put(t, b, key, fmt.Sprintf("generation 1 by %d", i), bucket.Cond{IfMatch: base.ETag})
			return err
		})
		if len(winners) != 1 {
			t.Fatalf("round %d: %d of %d If-Match swaps succeeded, want exactly 1", round, len(winners), Racers)
		}
		if _, body := mustGet(t, b, key); body != fmt.Sprintf("generation 1 by %d", winners[0]) {
			t.Fatalf("round %d: winner %d, stored %q", round, winners[0], body)
		}
	}
}

// genReader produces n pseudo-random bytes without holding them.
type genReader struct {
	rng *rand.ChaCha8
	n   int64
}

func (g *genReader) Read(p []byte) (int, error) {
	if g.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > g.n {
		p = p[:g.n]
	}
	g.rng.Read(p)
	g.n -= int64(len(p))
	return len(p), nil
}

// heapWatch samples HeapInuse until stopped and returns the peak growth over the start.
func heapWatch() (stop func() uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > base && ms.HeapInuse-base > peak.Load() {
				peak.Store(ms.HeapInuse - base)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-finished
		return peak.Load()
	}
}

func testLargeObject(t *testing.T, b bucket.Bucket, o options) {
	size := int64(100 << 20)
	if testing.Short() || o.holdsObjects {
		size = 12 << 20
	}
	// Collect garbage eagerly, so the heap peaks measure what is held, not what
	// is waiting for the next cycle.
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	seed := [32]byte{1, 2, 3}
	sent := sha256.New()
	stop := heapWatch()
	info, err := b.Put(context.Background(), "big", io.TeeReader(&genReader{rand.NewChaCha8(seed), size}, sent), size, bucket.Cond{IfNoneMatch: true})
	if err != nil {
		t.Fatal(err)
	}
	putPeak := stop()
	if info.Size != size {
		t.Fatalf("Put size %d, want %d", info.Size, size)
	}

	stop = heapWatch()
	obj, err := b.Get(context.Background(), "big")
	if err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	n, err := io.Copy(got, obj.Body)
	obj.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	getPeak := stop()
	if n != size || !bytes.Equal(got.Sum(nil), sent.Sum(nil)) {
		t.Fatalf("read back %d bytes, hash differs: %v", n, !bytes.Equal(got.Sum(nil), sent.Sum(nil)))
	}
	// A body of unknown size (a snapshot being produced) streams the same way.
	stop = heapWatch()
	unk, err := b.Put(context.Background(), "big-unknown-size", &genReader{rand.NewChaCha8(seed), size}, -1, bucket.Cond{IfNoneMatch: true})
	if err != nil {
		t.Fatal(err)
	}
	unknownPeak := stop()
	if unk.Size != size {
		t.Fatalf("unknown-size Put stored %d bytes, want %d", unk.Size, size)
	}
	if err := b.Delete(context.Background(), "big-unknown-size", bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d MiB object: heap grew at most %d MiB during Put, %d MiB during Get, %d MiB during an unknown-size Put",
		size>>20, putPeak>>20, getPeak>>20, unknownPeak>>20)
	// Loose: bounded part buffers are fine, holding the object is not.
	if o.holdsObjects {
		putPeak, unknownPeak = 0, 0
	}
	if !testing.Short() {
		if putPeak > uint64(size)/2 || getPeak > uint64(size)/2 || unknownPeak > uint64(size)/2 {
			t.Errorf("heap grew by %d MiB (Put) / %d MiB (Get) / %d MiB (unknown-size Put) for a %d MiB object: the body is being buffered",
				putPeak>>20, getPeak>>20, unknownPeak>>20, size>>20)
		}
	}
	// Conditional writes of bodies too big for one buffered request stay conditional,
	// and a lost one is ErrPreconditionFailed, not a transport error.
	for _, n := range []int64{2 << 20, 12 << 20} {
		if _, err := b.Put(context.Background(), "big", &genReader{rand.NewChaCha8(seed), n}, n, bucket.Cond{IfMatch: `"00000000000000000000000000000000"`}); !errors.Is(err, bucket.ErrPreconditionFailed) {
			t.Fatalf("If-Match put of %d MiB with a wrong ETag = %v, want ErrPreconditionFailed", n>>20, err)
		}
		if _, err := b.Put(context.Background(), "big", &genReader{rand.NewChaCha8(seed), n}, -1, bucket.Cond{IfNoneMatch: true}); !errors.Is(err, bucket.ErrPreconditionFailed) {
			t.Fatalf("If-None-Match put of %d MiB over an existing key = %v, want ErrPreconditionFailed", n>>20, err)
		}
		if h, err := b.Head(context.Background(), "big"); err != nil || h.ETag != info.ETag {
			t.Fatalf("a failed conditional put changed the object: %v %+v", err, h)
		}
	}
	next, err := b.Put(context.Background(), "big", &genReader{rand.NewChaCha8(seed), 2 << 20}, 2<<20, bucket.Cond{IfMatch: info.ETag})
	if err != nil {
		t.Fatalf("If-Match put of 2 MiB with the current ETag: %v", err)
	}
	if _, err := b.Put(context.Background(), "big", &genReader{rand.NewChaCha8(seed), 12 << 20}, 12<<20, bucket.Cond{IfMatch: next.ETag}); err != nil {
		t.Fatalf("If-Match put of 12 MiB with the current ETag: %v", err)
	}
}
