package spacestore

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// newChat is a space with one database of rowsAtStart rows; write(n) adds one row and
// checkpoints, n times.
func newChat(t *testing.T, b bucket.Bucket, rowsAtStart int) (*Syncer, func(n int)) {
	t.Helper()
	s := newSyncer(t, b, t.TempDir())
	os.MkdirAll(s.DataDir, 0o700)
	db := openDB(t, filepath.Join(s.DataDir, "app.db"))
	fillDB(t, db, rowsAtStart, 1000)
	return s, func(n int) {
		t.Helper()
		for range n {
			fillDB(t, db, 1, 1000)
			if _, err := s.Checkpoint(context.Background(), Periodic, nil, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestHistoryAndPointInTimeRestore: every checkpoint is listed; an asleep space restores to
// any of them as a new generation, which can itself be undone; a space awake elsewhere is
// refused with nothing written.
func TestHistoryAndPointInTimeRestore(t *testing.T) {
	ctx := context.Background()
	b := backends["file"](t)
	s, write := newChat(t, b, 500)
	write(10) // generations 1..10 hold 501..510 rows
	hist, _, err := History(ctx, b, "s.test")
	if err != nil || len(hist) != 10 {
		t.Fatalf("history = %d entries, %v; want 10", len(hist), err)
	}
	for i, cp := range hist {
		if cp.Generation != int64(i+1) || cp.Size <= 0 || cp.At.IsZero() {
			t.Fatalf("entry %d = %+v", i, cp)
		}
	}
	cli := Holder{ID: "cli:test", Incarnation: "1"}
	res, err := RestoreTo(ctx, b, "s.test", cli, Target{Generation: 3}, time.Hour, time.Now())
	if err != nil || res.Generation != 11 || res.From.Generation != 3 {
		t.Fatalf("restore to generation 3 = %+v, %v", res, err)
	}
	if got := rows(t, filepath.Join(restoreInto(t, b).DataDir, "app.db")); got != 503 {
		t.Fatalf("restored %d rows, want 503", got)
	}
	// Undo: back to generation 10, by time this time.
	res, err = RestoreTo(ctx, b, "s.test", cli, Target{At: hist[9].At.Add(time.Millisecond)}, time.Hour, time.Now())
	if err != nil || res.From.Generation != 10 || res.Generation != 12 {
		t.Fatalf("restore to %v = %+v, %v", hist[9].At, res, err)
	}
	if got := rows(t, filepath.Join(restoreInto(t, b).DataDir, "app.db")); got != 510 {
		t.Fatalf("restored %d rows after undo, want 510", got)
	}

	// Awake on a live box: refused, nothing written.
	live := func(h, i string) bool { return h == "https://a" }
	if _, err := AcquireLease(ctx, b, "s.test", Holder{ID: "https://a", Incarnation: "1", Live: live}, time.Now()); err != nil {
		t.Fatal(err)
	}
	_, before, _ := ReadManifest(ctx, b, "s.test")
	_, lease, _ := ReadLease(ctx, b, "s.test")
	var held *LeaseHeldError
	_, err = RestoreTo(ctx, b, "s.test", Holder{ID: "cli:test", Incarnation: "2", Live: live}, Target{Generation: 2}, time.Hour, time.Now())
	if !errors.As(err, &held) {
		t.Fatalf("restore of an awake space = %v, want LeaseHeldError", err)
	}
	_, after, _ := ReadManifest(ctx, b, "s.test")
	_, lease2, _ := ReadLease(ctx, b, "s.test")
	if before != after || lease != lease2 {
		t.Fatal("a refused restore wrote the manifest or the lease")
	}
	// Outside retention, or a generation that never was: refused.
	for _, tgt := range []Target{{Generation: 99}, {At: hist[0].At.Add(-time.Hour)}} {
		if _, err := RestoreTo(ctx, b, "s.test", cli, tgt, time.Hour, time.Now()); !errors.Is(err, ErrNoCheckpoint) {
			t.Fatalf("restore to %v = %v, want ErrNoCheckpoint", tgt, err)
		}
	}
	// A checkpoint whose objects are gone (collected by a box with a shorter retention) is
	// refused, nothing written.
	m3, _ := readHistory(ctx, b, hist[2])
	b.Delete(ctx, RefKey("s.test", m3.Refs()[0]), bucket.Cond{})
	_, before, _ = ReadManifest(ctx, b, "s.test")
	if _, err := RestoreTo(ctx, b, "s.test", cli, Target{Generation: 3}, time.Hour, time.Now()); err == nil || !strings.Contains(err.Error(), "no longer complete") {
		t.Fatalf("restore of an incomplete checkpoint = %v", err)
	}
	if _, after, _ := ReadManifest(ctx, b, "s.test"); after != before {
		t.Fatal("a refused restore wrote the manifest")
	}
	if _, err := ParseTarget("yesterday"); err == nil {
		t.Fatal("ParseTarget accepted garbage")
	}
	_ = s
}

// TestGCKeepsEveryRetainedCheckpoint: after many checkpoints and collections with no grace,
// every retained checkpoint still restores, expired ones are gone with their objects, and the
// bucket holds about one image plus retained deltas.
func TestGCKeepsEveryRetainedCheckpoint(t *testing.T) {
	ctx := context.Background()
	b := backends["file"](t)
	s, write := newChat(t, b, 2000)
	s.Retention = time.Nanosecond // only the newest keepGenerations are retained
	write(140)                    // collections at 64 and 128
	gs, err := Collect(ctx, b, "s.test", time.Nanosecond, -time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	hist, _, _ := History(ctx, b, "s.test")
	if len(hist) != keepGenerations || gs.History != keepGenerations {
		t.Fatalf("%d history entries kept (%+v), want %d", len(hist), gs, keepGenerations)
	}
	// Exactly the objects of retained checkpoints are left.
	refs, err := historyRefs(ctx, b, hist, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, rs := range refs {
		for _, r := range rs {
			want[RefKey("s.test", r)] = true
		}
	}
	got := listKeys(t, b, "spaces/s.test/objs/")
	for k := range got {
		if !want[k] {
			t.Errorf("GC left unreferenced %s", k)
		}
	}
	for k := range want {
		if !got[k] {
			t.Errorf("GC deleted referenced %s", k)
		}
	}
	if gs.Deleted == 0 || gs.HistoryDeleted == 0 {
		t.Fatalf("GC deleted nothing: %+v", gs)
	}
	cli := Holder{ID: "cli", Incarnation: "1"}
	for _, cp := range []Checkpoint{hist[0], hist[len(hist)/2]} {
		if _, err := RestoreTo(ctx, b, "s.test", cli, Target{Generation: cp.Generation}, time.Hour, time.Now()); err != nil {
			t.Fatal(err)
		}
		want := 2000 + int(cp.Generation)
		if got := rows(t, filepath.Join(restoreInto(t, b).DataDir, "app.db")); got != want {
			t.Fatalf("generation %d restored %d rows, want %d", cp.Generation, got, want)
		}
	}
}

// TestGCBesideOtherWriters: collections while a fenced-out writer uploads, while a next
// generation's objects are in flight, while a relocate copies the space and while two boxes
// wake it, delete nothing any of them needs.
func TestGCBesideOtherWriters(t *testing.T) {
	ctx := context.Background()
	b := backends["file"](t)
	a, write := newChat(t, b, 1500)
	write(3)

	// A fenced-out writer: B loaded generation 3, A moved on.
	bsync := restoreInto(t, b)
	bdb := openDB(t, filepath.Join(bsync.DataDir, "app.db"))
	write(20)
	fillDB(t, bdb, 50, 1000)
	if _, err := Collect(ctx, b, "s.test", time.Nanosecond, -time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	before := listKeys(t, b, "spaces/s.test/objs/")
	if _, err := bsync.Checkpoint(ctx, Periodic, nil, time.Now()); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale writer's checkpoint = %v, want ErrFenced", err)
	}
	var orphans []string
	for k := range listKeys(t, b, "spaces/s.test/objs/") {
		if !before[k] {
			orphans = append(orphans, k)
		}
	}
	if len(orphans) == 0 {
		t.Fatal("the stale writer uploaded nothing")
	}
	// An upload for the next generation, not yet in any manifest, survives a collection.
	cur, _ := a.Manifest()
	next := ObjectKey("s.test", cur.Generation+1, strings.Repeat("ab", 32))
	b.Put(ctx, next, strings.NewReader("in flight"), 9, bucket.Cond{})
	if _, err := Collect(ctx, b, "s.test", time.Nanosecond, -time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Head(ctx, next); err != nil {
		t.Fatalf("GC deleted the next generation's object: %v", err)
	}
	if got := rows(t, filepath.Join(restoreInto(t, b).DataDir, "app.db")); got != 1523 {
		t.Fatalf("after the fenced writer and GC the space restores %d rows, want 1523", got)
	}

	// A relocate copy of the current manifest, with a wake writing and collecting meanwhile.
	dst := backends["file"](t)
	refs := cur.Refs()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 3 {
			write(1)
			if _, err := Collect(ctx, b, "s.test", time.Nanosecond, -time.Hour, nil); err != nil {
				t.Error(err)
			}
		}
	}()
	for _, r := range refs {
		obj, err := b.Get(ctx, RefKey("s.test", r))
		if err != nil {
			t.Fatalf("relocate copy lost %s: %v", r.Key, err)
		}
		data, _ := io.ReadAll(obj.Body)
		obj.Body.Close()
		dst.Put(ctx, RefKey("s.test", r), strings.NewReader(string(data)), int64(len(data)), bucket.Cond{})
	}
	wg.Wait()
	if _, err := WriteManifest(ctx, dst, "s.test", cur, ""); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, filepath.Join(restoreInto(t, dst).DataDir, "app.db")); got != 1523 {
		t.Fatalf("relocated copy restored %d rows, want 1523", got)
	}
	// CopySpace (relocate) of the asleep space while collectors run.
	stopGC := make(chan struct{})
	gcDone := make(chan struct{})
	go func() {
		defer close(gcDone)
		for {
			select {
			case <-stopGC:
				return
			default:
				Collect(ctx, b, "s.test", time.Nanosecond, -time.Hour, nil)
			}
		}
	}()
	dst2 := backends["file"](t)
	if _, err := CopySpace(ctx, b, dst2, "s.test", nil, nil); err != nil {
		t.Fatalf("relocate copy beside GC: %v", err)
	}
	close(stopGC)
	<-gcDone
	if got := rows(t, filepath.Join(restoreInto(t, dst2).DataDir, "app.db")); got != 1526 {
		t.Fatalf("relocated copy restored %d rows, want 1526", got)
	}
	// Two boxes wake the space while a collector runs.
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				Collect(ctx, b, "s.test", time.Nanosecond, -time.Hour, nil)
			}
		}
	}()
	var wakes sync.WaitGroup
	for range 2 {
		wakes.Add(1)
		go func() {
			defer wakes.Done()
			for range 3 {
				r := newSyncer(t, b, t.TempDir())
				if err := r.Load(ctx); err != nil {
					t.Error(err)
					return
				}
				if err := r.Restore(ctx); err != nil {
					t.Errorf("wake beside GC: %v", err)
					return
				}
			}
		}()
	}
	wakes.Wait()
	close(stop)
	// The fenced writer's orphans go once their generation is no newer than the current one.
	left := listKeys(t, b, "spaces/s.test/objs/")
	for _, k := range orphans {
		if left[k] {
			t.Fatalf("fenced writer's orphan %s survived", k)
		}
	}
}

// TestCopySpaceCarriesFormat2Objects: a relocation copy of a space with a page image (base
// and deltas) and chunked files restores in the destination bucket.
func TestCopySpaceCarriesFormat2Objects(t *testing.T) {
	ctx := context.Background()
	src, dst := backends["file"](t), backends["file"](t)
	s, write := newChat(t, src, 2000)
	os.WriteFile(filepath.Join(s.DataDir, "notes.txt"), []byte("plain file"), 0o600)
	write(12)
	m, _ := s.Manifest()
	if len(m.Files[0].Content.DB.Deltas) == 0 {
		t.Fatal("no deltas to copy")
	}
	hist, _, _ := History(ctx, src, "s.test")
	res, err := CopySpace(ctx, src, dst, "s.test", nil, nil)
	// The manifest's objects and those of older checkpoints (history follows the space).
	if err != nil || res.Generation != m.Generation || res.Blobs < len(m.Refs()) || res.History != len(hist) {
		t.Fatalf("copy = %+v, %v; want generation %d, at least %d objects, %d history entries", res, err, m.Generation, len(m.Refs()), len(hist))
	}
	r := restoreInto(t, dst)
	if got := rows(t, filepath.Join(r.DataDir, "app.db")); got != 2012 {
		t.Fatalf("copy restored %d rows, want 2012", got)
	}
	if data, _ := os.ReadFile(filepath.Join(r.DataDir, "notes.txt")); string(data) != "plain file" {
		t.Fatalf("copy restored notes.txt = %q", data)
	}
}
