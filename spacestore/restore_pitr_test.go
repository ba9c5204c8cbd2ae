package spacestore

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// landedAt is the LastModified of a segment of s.test, as a listing gives it.
func landedAt(t *testing.T, b bucket.Bucket, gen, seq int64) time.Time {
	t.Helper()
	logs, err := listLogEntries(context.Background(), b, "s.test", LogGenPrefix("s.test", gen))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range logs[gen] {
		if e.seq == seq {
			return e.LastModified
		}
	}
	t.Fatalf("segment %d of generation %d not listed", seq, gen)
	return time.Time{}
}

// waitBucketPast waits until what the bucket stamps on a new object is after at: the next
// object then lands after at at the bucket's precision (S3 lists whole seconds).
func waitBucketPast(t *testing.T, b bucket.Bucket, at time.Time) {
	t.Helper()
	harness.WaitFor(t, 10*time.Second, "the bucket's clock past "+at.String(), func() bool {
		if _, err := b.Put(context.Background(), "probe", strings.NewReader("p"), 1, bucket.Cond{}); err != nil {
			t.Fatal(err)
		}
		info, err := b.Head(context.Background(), "probe")
		return err == nil && info.LastModified.After(at)
	})
}

// TestRestoreToTimeAppliesTheLog: writes acknowledged between checkpoints (log segments)
// are points a restore reaches. A space checkpoints 10 rows (generation 1), ships three
// one-row segments, is taken over (its log sealed) and ships a fourth, checkpoints
// (generation 2) and ships a fifth. `history` lists each checkpoint's log; a restore to the
// LastModified of each segment brings back exactly the rows up to it, through the seal; a
// time between a checkpoint and its first segment brings back the checkpoint alone. The
// restore seals the current log, so the last holder's next append fails rather than be
// acknowledged in a log nobody reads. The logs stay until their checkpoints expire.
func TestRestoreToTimeAppliesTheLog(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		a := takeOver(t, b, "a")
		a.seal()
		db := a.open()
		fillDB(t, db, 10, 100)
		a.checkpoint() // generation 1: 10 rows
		hist, _, err := History(ctx, b, "s.test")
		if err != nil || len(hist) != 1 {
			t.Fatalf("history = %+v, %v", hist, err)
		}
		cp1 := hist[0].At
		waitBucketPast(t, b, cp1)
		var landed []time.Time // of the rows 11.., in order
		one := func(h *logHolder) {
			t.Helper()
			fillDB(t, h.db, 1, 100)
			seg := h.shipOne()
			at := landedAt(t, b, seg.Gen, seg.Seq)
			landed = append(landed, at)
			waitBucketPast(t, b, at)
		}
		one(a)
		one(a)
		one(a) // segments 1..3 of generation 1: 11..13 rows
		db.Close()
		c := takeOver(t, b, "c") // a wake: applies 1..3, seals at 4
		c.seal()
		c.open()
		one(c) // segment 5: 14 rows
		c.checkpoint()
		if g := c.gen(); g != 2 {
			t.Fatalf("checkpoint made generation %d, want 2", g)
		}
		one(c) // segment 1 of generation 2: 15 rows

		tl, _, err := Timeline(ctx, b, "s.test")
		if err != nil || len(tl) != 2 || tl[0].Log == nil || tl[0].Log.Segments != 5 || tl[1].Log == nil || tl[1].Log.Segments != 1 {
			t.Fatalf("timeline = %+v, %v; want 5 segments (a seal among them) after generation 1, 1 after 2", tl, err)
		}
		if !tl[0].Log.First.Equal(landed[0]) || !tl[0].Log.Last.Equal(landed[3]) {
			t.Fatalf("generation 1's log spans %v..%v, want %v..%v", tl[0].Log.First, tl[0].Log.Last, landed[0], landed[3])
		}

		cli := Holder{ID: "cli:test", Incarnation: "1"}
		opts := RestoreOptions{Retention: time.Hour, WorkDir: t.TempDir(), SealLog: true}
		cases := []struct {
			at        time.Time
			from      int64
			segments  int
			rows      int
			generated int64
		}{
			{landed[4], 2, 1, 15, 3}, // first, with the last holder's log still open
			{landed[1], 1, 2, 12, 4},
			{cp1, 1, 0, 10, 5},
			{landed[3], 1, 4, 14, 6}, // through the takeover's seal
			{landed[0], 1, 1, 11, 7},
		}
		for i, tc := range cases {
			res, err := RestoreToWith(ctx, b, "s.test", cli, Target{At: tc.at}, opts, time.Now())
			if err != nil || res.From.Generation != tc.from || res.Segments != tc.segments || res.Generation != tc.generated {
				t.Fatalf("restore to %v = %+v, %v; want from %d with %d segments as %d", tc.at, res, err, tc.from, tc.segments, tc.generated)
			}
			if got := rows(t, filepath.Join(restoreInto(t, b).DataDir, "app.db")); got != tc.rows {
				t.Fatalf("restore to %v brought back %d rows, want %d", tc.at, got, tc.rows)
			}
			if i == 0 {
				// The restore sealed generation 2's log: c, paused rather than dead, cannot
				// acknowledge a write there any more.
				fillDB(t, c.db, 1, 100)
				seg, err := c.ship.Next(ctx, settled())
				if err != nil || seg == nil {
					t.Fatalf("Next = %v, %v", seg, err)
				}
				if err := AppendSegment(ctx, b, "s.test", seg); !errors.Is(err, ErrLogSealed) {
					t.Fatalf("the earlier holder's append after the restore: %v, want ErrLogSealed", err)
				}
			}
		}
		// A generation names its checkpoint alone.
		res, err := RestoreToWith(ctx, b, "s.test", cli, Target{Generation: 2}, opts, time.Now())
		if err != nil || res.Segments != 0 {
			t.Fatalf("restore to generation 2 = %+v, %v", res, err)
		}
		if got := rows(t, filepath.Join(restoreInto(t, b).DataDir, "app.db")); got != 14 {
			t.Fatalf("generation 2 holds %d rows, want 14", got)
		}
		// GC keeps every retained checkpoint's log.
		st, err := Collect(ctx, b, "s.test", time.Hour, 0, nil)
		if err != nil || st.LogsDeleted != 0 {
			t.Fatalf("collect = %+v, %v; want no log deleted", st, err)
		}
		if res, err := RestoreToWith(ctx, b, "s.test", cli, Target{At: landed[1]}, opts, time.Now()); err != nil || res.Segments != 2 {
			t.Fatalf("restore after GC = %+v, %v", res, err)
		}
	})
}

// failManifest fails every write of the manifest: a restore that dies at its swap, after
// everything before it was written.
type failManifest struct{ bucket.Bucket }

func (f failManifest) Put(ctx context.Context, key string, r io.Reader, size int64, c bucket.Cond) (bucket.Info, error) {
	if strings.HasSuffix(key, "/manifest") {
		return bucket.Info{}, errors.New("crash before the swap")
	}
	return f.Bucket.Put(ctx, key, r, size, c)
}

// TestRestoreToTimeAllOrNothing: a restore that applies segments and dies at its swap
// leaves the space as it was: the same manifest, and nothing a later holder reads. The
// holder that wakes next checkpoints the generation number the restore would have taken and
// ships its log; the wake after that restores exactly its rows. A log of the new generation
// written before the swap would have been read there on top of a state it does not extend.
func TestRestoreToTimeAllOrNothing(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		a := takeOver(t, b, "a")
		a.seal()
		a.open()
		fillDB(t, a.db, 10, 100)
		a.checkpoint() // generation 1
		fillDB(t, a.db, 1, 100)
		seg := a.shipOne()
		at := landedAt(t, b, seg.Gen, seg.Seq)
		a.db.Close()
		_, before, _ := ReadManifest(ctx, b, "s.test")
		cli := Holder{ID: "cli:test", Incarnation: "1"}
		_, err := RestoreToWith(ctx, failManifest{b}, "s.test", cli, Target{At: at}, RestoreOptions{WorkDir: t.TempDir()}, time.Now())
		if err == nil {
			t.Fatal("the restore succeeded without its manifest")
		}
		if _, after, _ := ReadManifest(ctx, b, "s.test"); after != before {
			t.Fatal("a restore that failed its swap changed the manifest")
		}
		c := takeOver(t, b, "c") // 11 rows
		c.seal()
		c.open()
		fillDB(t, c.db, 5, 100)
		c.checkpoint() // generation 2: what the restore would have written
		fillDB(t, c.db, 1, 100)
		c.shipOne() // log of generation 2
		c.db.Close()
		d := takeOver(t, b, "d")
		if got := count(t, d.s.DataDir, "app.db"); got != 17 {
			t.Fatalf("after the failed restore the space holds %d rows, want 17", got)
		}
	})
}

// TestParseTargetRefusesEmpty: an empty --at is refused with a message that says what is
// missing.
func TestParseTargetRefusesEmpty(t *testing.T) {
	if _, err := ParseTarget(""); err == nil || !strings.Contains(err.Error(), "required") {
		t.Fatalf("ParseTarget(\"\") = %v", err)
	}
	if _, err := ParseTarget(" "); err == nil {
		t.Fatal("ParseTarget accepted a blank")
	}
}
