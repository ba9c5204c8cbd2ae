package spacestore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
)

// logBuckets are the buckets the log is tested against: the in-memory one and the file one.
var logBuckets = map[string]func(t *testing.T) bucket.Bucket{
	"mem": func(t *testing.T) bucket.Bucket { return membucket.New() },
	"file": func(t *testing.T) bucket.Bucket {
		b, err := filebucket.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return b
	},
}

// forEachLogBucket runs f on each bucket, with the shippers of the test keeping their
// views' connections (as the engine's do) and opening each view's own (freshLogViews).
func forEachLogBucket(t *testing.T, f func(t *testing.T, b bucket.Bucket)) {
	for _, fresh := range []bool{false, true} {
		for name, mk := range logBuckets {
			if fresh {
				name += "/fresh"
			}
			t.Run(name, func(t *testing.T) {
				freshLogViews = fresh
				defer func() { freshLogViews = false }()
				f(t, mk(t))
			})
		}
	}
}

// freshLogViews makes testShipper's shippers open a connection per view, as before they
// kept them: both ways must ship the same.
var freshLogViews bool

// testShipper is NewLogShipper for the tests, closed with the test.
func testShipper(t testing.TB, dataDir string, reader *PageReader, base *LogBase, gen, next int64, claim Claim) *LogShipper {
	l := NewLogShipper(dataDir, reader, base, gen, next, claim)
	if freshLogViews {
		l.keep.Close()
		l.keep = nil
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// settled is a clock far enough ahead that every stat signature taken now is trusted:
// these tests write nothing while a shipper reads.
func settled() time.Time { return time.Now().Add(time.Second) }

// logHolder is one box holding the space s.test: its syncer, its instance's database
// (app.db in WAL mode) and its shipper.
type logHolder struct {
	t     *testing.T
	b     bucket.Bucket
	s     *Syncer
	claim Claim
	db    *sql.DB
	ship  *LogShipper
	base  *LogBase
	log   *Log
}

// takeOver restores s.test as a new holder would: the manifest, fenced with the holder's
// claim, then the log of its generation, sealed and applied.
func takeOver(t *testing.T, b bucket.Bucket, holder string) *logHolder {
	t.Helper()
	ctx := context.Background()
	h := &logHolder{t: t, b: b, s: newSyncer(t, b, t.TempDir()),
		claim: Claim{Holder: "https://" + holder, Incarnation: "1", Lease: `"lease-` + holder + `"`, At: time.Now()}}
	if err := h.s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.s.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.s.Fence(ctx, h.claim); err != nil {
		t.Fatal(err)
	}
	h.base = h.s.LogBase()
	gen := h.gen()
	log, err := ReadLog(ctx, b, "s.test", gen)
	if err != nil {
		t.Fatal(err)
	}
	h.log = log
	if err := h.s.ApplySegments(h.base, log.Segments); err != nil {
		t.Fatal(err)
	}
	return h
}

// seal seals the log read by takeOver, applies what landed meanwhile and starts shipping.
func (h *logHolder) seal() (more []*Segment, next int64) {
	h.t.Helper()
	more, next, err := SealLog(context.Background(), h.b, "s.test", h.gen(), h.claim, h.log)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.s.ApplySegments(h.base, more); err != nil {
		h.t.Fatal(err)
	}
	h.ship = testShipper(h.t, h.s.DataDir, nil, h.base, h.gen(), next, h.claim)
	return more, next
}

func (h *logHolder) gen() int64 {
	if m, _ := h.s.Manifest(); m != nil {
		return m.Generation
	}
	return 0
}

func (h *logHolder) open() *sql.DB {
	h.db = openDB(h.t, filepath.Join(h.s.DataDir, "app.db"))
	return h.db
}

// checkpoint checkpoints and starts the log of the new generation.
func (h *logHolder) checkpoint() {
	h.t.Helper()
	if _, err := h.s.Checkpoint(context.Background(), Periodic, nil, time.Now()); err != nil {
		h.t.Fatal(err)
	}
	if h.ship != nil {
		h.ship.Close()
	}
	h.ship = testShipper(h.t, h.s.DataDir, nil, h.s.LogBase(), h.gen(), 1, h.claim)
}

// shipOne builds the next segment, which must exist, and appends it; then nothing is new.
func (h *logHolder) shipOne() *Segment {
	h.t.Helper()
	ctx := context.Background()
	seg, err := h.ship.Next(ctx, settled())
	if err != nil {
		h.t.Fatal(err)
	}
	if seg == nil {
		h.t.Fatal("Next found nothing new after commits")
	}
	if err := AppendSegment(ctx, h.b, "s.test", seg); err != nil {
		h.t.Fatal(err)
	}
	if again, err := h.ship.Next(ctx, settled()); err != nil || again != nil {
		h.t.Fatalf("Next right after a segment = %v, %v; want nothing new", again, err)
	}
	return seg
}

// count returns the rows of messages in the database at rel of a data dir, after checking
// its integrity.
func count(t *testing.T, dataDir, rel string) int {
	t.Helper()
	return rows(t, filepath.Join(dataDir, filepath.FromSlash(rel)))
}

// TestLogRestoresEveryShippedRow: rows committed in several transactions after a
// checkpoint, shipped as a segment after each group, are all back after the data dir is
// lost: the manifest restores the checkpoint's rows, its log the rest, in a database that
// passes integrity_check; a database created after the checkpoint comes back too; the next
// checkpoint of the holder that restored carries them all.
func TestLogRestoresEveryShippedRow(t *testing.T) {
	forEachLogBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		a := takeOver(t, b, "a")
		a.seal()
		db := a.open()
		fillDB(t, db, 40, 200)
		os.WriteFile(filepath.Join(a.s.DataDir, "notes.txt"), []byte("not shipped"), 0o600)
		jdb, err := sql.Open("sqlite", "file:"+filepath.Join(a.s.DataDir, "journal.db")+"?_pragma=journal_mode(DELETE)")
		if err != nil {
			t.Fatal(err)
		}
		defer jdb.Close()
		fillDB(t, jdb, 3, 10)
		a.checkpoint()
		if seg, err := a.ship.Next(ctx, settled()); err != nil || seg != nil {
			t.Fatalf("Next with nothing committed since the checkpoint = %v, %v; want nothing", seg, err)
		}

		os.MkdirAll(filepath.Join(a.s.DataDir, "sub"), 0o700)
		newDB := openDB(t, filepath.Join(a.s.DataDir, "sub", "new.db"))
		want := 40
		for g := range 4 {
			for range 3 { // three transactions per group
				fillDB(t, db, 5, 300)
				want += 5
			}
			if g == 1 {
				fillDB(t, newDB, 7, 100)
			}
			seg := a.shipOne()
			if seg.Seq != int64(g+1) || seg.Gen != 1 {
				t.Fatalf("segment %d of generation %d, want %d of 1", seg.Seq, seg.Gen, g+1)
			}
		}
		skipped := a.ship.Skipped()
		for _, want := range []SkippedFile{{Path: "notes.txt", Kind: "file"}, {Path: "journal.db", Kind: "rollback-journal database"}} {
			if !slices.Contains(skipped, want) {
				t.Fatalf("Skipped() = %v, want it to name %v", skipped, want)
			}
		}
		db.Close()
		newDB.Close()
		os.RemoveAll(a.s.DataDir) // the box is gone

		if got := count(t, restoreInto(t, b).DataDir, "app.db"); got != 40 {
			t.Fatalf("the manifest alone restored %d rows, want the checkpoint's 40", got)
		}
		c := takeOver(t, b, "c")
		if len(c.log.Segments) != 4 {
			t.Fatalf("ReadLog found %d segments, want 4", len(c.log.Segments))
		}
		if got := count(t, c.s.DataDir, "app.db"); got != want {
			t.Fatalf("manifest plus log restored %d rows, want %d", got, want)
		}
		if got := count(t, c.s.DataDir, "sub/new.db"); got != 7 {
			t.Fatalf("the database created after the checkpoint has %d rows, want 7", got)
		}
		c.checkpoint()
		if got := count(t, restoreInto(t, b).DataDir, "app.db"); got != want {
			t.Fatalf("the restoring holder's checkpoint restores %d rows, want %d", got, want)
		}
	})
}

// TestLogShipsAcrossWALRestart: SQLite moving the WAL into the database and restarting it
// (wal_checkpoint(TRUNCATE)) between segments, even right after commits not yet shipped,
// loses nothing: the shipper compares every page when the WAL's salts changed.
func TestLogShipsAcrossWALRestart(t *testing.T) {
	forEachLogBucket(t, func(t *testing.T, b bucket.Bucket) {
		a := takeOver(t, b, "a")
		a.seal()
		db := a.open()
		fillDB(t, db, 30, 200)
		a.checkpoint()
		want := 30
		steps := []struct {
			name    string
			restart bool // after the commits, before shipping
		}{
			{"tail", false},
			{"commits moved into the database", true},
			{"a restarted WAL", false},
			{"again moved", true},
		}
		for _, st := range steps {
			fillDB(t, db, 6, 500)
			fillDB(t, db, 6, 500)
			want += 12
			if st.restart {
				var busy, logged, moved int
				if err := db.QueryRow("PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &logged, &moved); err != nil || busy != 0 {
					t.Fatalf("wal_checkpoint = %d, %v", busy, err)
				}
				if fi, err := os.Stat(filepath.Join(a.s.DataDir, "app.db-wal")); err != nil || fi.Size() != 0 {
					t.Fatalf("WAL after TRUNCATE: %v, %v", fi, err)
				}
			}
			a.shipOne()
		}
		db.Close()
		os.RemoveAll(a.s.DataDir)
		c := takeOver(t, b, "c")
		if got := count(t, c.s.DataDir, "app.db"); got != want {
			t.Fatalf("restored %d rows, want %d", got, want)
		}
	})
}

// TestLogSealShutsOutOldHolder: a takeover's seal lands after what the old holder appended
// (including a segment that landed while the seal was being written, which is applied);
// the old holder's next append is ErrLogSealed; the new holder ships on after the seal
// from a base in step with what it applied, and a later restore has both holders' rows.
func TestLogSealShutsOutOldHolder(t *testing.T) {
	forEachLogBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		a := takeOver(t, b, "a")
		a.seal()
		adb := a.open()
		fillDB(t, adb, 20, 100)
		a.checkpoint()
		want := 20
		for range 2 {
			fillDB(t, adb, 4, 100)
			want += 4
			a.shipOne()
		}

		bh := takeOver(t, b, "b") // reads segments 1 and 2
		fillDB(t, adb, 4, 100)    // a, still running, lands segment 3 before b's seal
		want += 4
		a.shipOne()
		more, next := bh.seal()
		if len(more) != 1 || more[0].Seq != 3 || next != 5 {
			t.Fatalf("SealLog returned %d segments (first %v) and next %d; want segment 3 and next 5", len(more), more, next)
		}
		fillDB(t, adb, 4, 100) // never acknowledged: its segment cannot land
		seg, err := a.ship.Next(ctx, settled())
		if err != nil || seg == nil {
			t.Fatalf("old holder's Next = %v, %v", seg, err)
		}
		if err := AppendSegment(ctx, b, "s.test", seg); !errors.Is(err, ErrLogSealed) {
			t.Fatalf("old holder's append after the seal = %v, want ErrLogSealed", err)
		}
		if got := count(t, bh.s.DataDir, "app.db"); got != want {
			t.Fatalf("the new holder has %d rows, want the old holder's %d", got, want)
		}
		if seg, err := bh.ship.Next(ctx, settled()); err != nil || seg != nil {
			t.Fatalf("new holder's first Next = %v, %v; want nothing: the applied pages are its base", seg, err)
		}
		bdb := bh.open()
		fillDB(t, bdb, 3, 100)
		want += 3
		if seg := bh.shipOne(); seg.Seq != 5 {
			t.Fatalf("new holder shipped segment %d, want 5", seg.Seq)
		}
		bdb.Close()

		c := takeOver(t, b, "c")
		if c.log.Sealer == nil || !sameClaim(*c.log.Sealer, bh.claim) || c.log.Last != 5 || len(c.log.Segments) != 4 {
			t.Fatalf("log = last %d, sealer %+v, %d segments; want 5, b's claim, 4", c.log.Last, c.log.Sealer, len(c.log.Segments))
		}
		if got := count(t, c.s.DataDir, "app.db"); got != want {
			t.Fatalf("restored %d rows, want %d", got, want)
		}
	})
}

// TestLogGapEndsIt: a missing segment ends the log, what follows it is never applied; a
// seal written at the gap shuts the orphan out for good, and the sealer appends past it.
func TestLogGapEndsIt(t *testing.T) {
	forEachLogBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		a := takeOver(t, b, "a")
		a.seal()
		db := a.open()
		fillDB(t, db, 10, 100)
		a.checkpoint()
		for range 3 {
			fillDB(t, db, 5, 100)
			a.shipOne()
		}
		db.Close()
		if err := b.Delete(ctx, LogKey("s.test", 1, 2), bucket.Cond{}); err != nil {
			t.Fatal(err)
		}
		c := takeOver(t, b, "c")
		if len(c.log.Segments) != 1 || c.log.Last != 1 || !slices.Equal(c.log.Orphans, []int64{3}) {
			t.Fatalf("log = %d segments, last %d, orphans %v; want 1, 1, [3]", len(c.log.Segments), c.log.Last, c.log.Orphans)
		}
		if got := count(t, c.s.DataDir, "app.db"); got != 15 {
			t.Fatalf("restored %d rows, want the 15 before the gap", got)
		}
		if _, next := c.seal(); next != 4 {
			t.Fatalf("next after a seal at the gap = %d, want 4 (past the orphan)", next)
		}
		l, err := ReadLog(ctx, b, "s.test", 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Segments) != 1 || l.Last != 3 || !slices.Equal(l.Stale, []int64{3}) {
			t.Fatalf("log after the seal = %d segments, last %d, stale %v; want 1, 3, [3]", len(l.Segments), l.Last, l.Stale)
		}
	})
}

// shippedSegment returns a real encoded segment: rows committed to a WAL database after its
// checkpoint.
func shippedSegment(t testing.TB) []byte {
	dir := t.TempDir()
	b := membucket.New()
	s := newSyncer(t, b, dir)
	os.MkdirAll(s.DataDir, 0o700)
	db := openDB(t, filepath.Join(s.DataDir, "app.db"))
	fillDB(t, db, 5, 100)
	if _, err := s.Checkpoint(context.Background(), Periodic, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	fillDB(t, db, 5, 100)
	ship := testShipper(t, s.DataDir, nil, s.LogBase(), 1, 1, Claim{Holder: "https://a", Incarnation: "1", Lease: `"l"`, At: time.Unix(1e9, 0)})
	seg, err := ship.Next(context.Background(), settled())
	if err != nil || seg == nil {
		t.Fatalf("Next = %v, %v", seg, err)
	}
	data, err := EncodeSegment(seg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestLogRefusesMalformedSegments: a segment that is not whole and right is an error, from
// DecodeSegment and from ReadLog, never a shorter log; one filed under another seq too.
func TestLogRefusesMalformedSegments(t *testing.T) {
	good := shippedSegment(t)
	if _, err := DecodeSegment(good); err != nil {
		t.Fatalf("a shipped segment does not decode: %v", err)
	}
	seg, _ := DecodeSegment(good)
	ltxAt := bytes.Index(good, seg.DBs[0].LTX)
	flip := func(i int) []byte {
		b := bytes.Clone(good)
		b[i] ^= 0x40
		return b
	}
	cases := map[string][]byte{
		"garbage":           []byte("hello"),
		"empty":             nil,
		"truncated":         good[:len(good)-1],
		"trailing byte":     append(bytes.Clone(good), 0),
		"version 9":         flip(4),
		"page size":         flip(ltxAt - 9),
		"a byte of the LTX": flip(ltxAt + len(seg.DBs[0].LTX) - 20),
		"LTX page length":   flip(ltxAt + 100 + 6),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodeSegment(data); err == nil {
				t.Fatal("DecodeSegment accepted it")
			}
			b := membucket.New()
			ctx := context.Background()
			if _, err := b.Put(ctx, LogKey("s.test", 1, 1), bytes.NewReader(good), -1, bucket.Cond{}); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Put(ctx, LogKey("s.test", 1, 2), bytes.NewReader(data), -1, bucket.Cond{}); err != nil {
				t.Fatal(err)
			}
			if l, err := ReadLog(ctx, b, "s.test", 1); err == nil {
				t.Fatalf("ReadLog read %d segments and no error", len(l.Segments))
			}
		})
	}
	t.Run("filed under another seq", func(t *testing.T) {
		b := membucket.New()
		ctx := context.Background()
		b.Put(ctx, LogKey("s.test", 1, 1), bytes.NewReader(good), -1, bucket.Cond{})
		b.Put(ctx, LogKey("s.test", 1, 2), bytes.NewReader(good), -1, bucket.Cond{})
		if _, err := ReadLog(ctx, b, "s.test", 1); err == nil {
			t.Fatal("ReadLog accepted segment 1 at seq 2")
		}
	})
}

// TestAppendSegmentOutcomes: an append retried after an answer that was lost finds its own
// bytes and succeeds; another segment at a taken seq is ErrLogSealed; a seal is not
// appended.
func TestAppendSegmentOutcomes(t *testing.T) {
	forEachLogBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		seg, err := DecodeSegment(shippedSegment(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := AppendSegment(ctx, b, "s.test", seg); err != nil {
			t.Fatal(err)
		}
		if err := AppendSegment(ctx, b, "s.test", seg); err != nil {
			t.Fatalf("the same append again = %v, want nil (it landed)", err)
		}
		other := *seg
		other.Claim.Lease = `"another"`
		if err := AppendSegment(ctx, b, "s.test", &other); !errors.Is(err, ErrLogSealed) {
			t.Fatalf("another segment at a taken seq = %v, want ErrLogSealed", err)
		}
		seal := &Segment{Gen: 1, Seq: 2, Claim: seg.Claim, Seal: true}
		if err := AppendSegment(ctx, b, "s.test", seal); err == nil {
			t.Fatal("AppendSegment wrote a seal")
		}
	})
}

// TestCollectLogs: the logs of generations below the current manifest's are deleted once
// older than the grace (keep nil keeps none), the current one kept, and a second run finds
// nothing. Within the grace a collected log's seal stays, so an earlier
// holder's late append at the sealed seq still fails (ErrLogSealed) rather than land on a
// free key of a log nobody reads: the campaign's lost writes (seed 1796561633074473269).
func TestCollectLogs(t *testing.T) {
	forEachLogBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		c := Claim{Holder: "https://a", Incarnation: "1", Lease: `"l"`}
		for gen := int64(1); gen <= 3; gen++ {
			_, _, err := SealLog(ctx, b, "s.test", gen, c, &Log{Gen: gen})
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = SealLog(ctx, b, "s.test", gen, c, &Log{Gen: gen, Last: 1})
			if err != nil {
				t.Fatal(err)
			}
		}
		if _, err := WriteManifest(ctx, b, "s.test", &Manifest{Format: Format, Generation: 3}, ""); err != nil {
			t.Fatal(err)
		}
		prefixes, err := LogPrefixesBefore(ctx, b, "s.test", 3)
		if err != nil || !slices.Equal(prefixes, []string{LogGenPrefix("s.test", 1), LogGenPrefix("s.test", 2)}) {
			t.Fatalf("LogPrefixesBefore = %v, %v", prefixes, err)
		}
		if n, err := CollectLogs(ctx, b, "s.test", nil, time.Hour); err != nil || n != 0 {
			t.Fatalf("CollectLogs within the grace = %d, %v; want 0", n, err)
		}
		late, err := DecodeSegment(shippedSegment(t))
		if err != nil {
			t.Fatal(err)
		}
		late.Gen, late.Seq = 1, 2 // an earlier holder's next append, at the seq sealed in generation 1
		late.Claim = Claim{Holder: "https://old", Incarnation: "0", Lease: `"o"`}
		if err := AppendSegment(ctx, b, "s.test", late); !errors.Is(err, ErrLogSealed) {
			t.Fatalf("a late append at a collected log's sealed seq, within the grace: %v, want ErrLogSealed", err)
		}
		if n, err := CollectLogs(ctx, b, "s.test", nil, 0); err != nil || n != 4 {
			t.Fatalf("CollectLogs = %d, %v; want the 4 segments of generations 1 and 2", n, err)
		}
		if n, err := CollectLogs(ctx, b, "s.test", nil, 0); err != nil || n != 0 {
			t.Fatalf("CollectLogs again = %d, %v; want 0", n, err)
		}
		l, err := ReadLog(ctx, b, "s.test", 3)
		if err != nil || l.Last != 2 {
			t.Fatalf("the current log after collection: %+v, %v", l, err)
		}
	})
}

// TestLogNothingNewIsCheap: with nothing committed, Next opens no database once the files'
// signatures are older than racyMargin; a signature taken within racyMargin of a write is
// not trusted, and a commit is always seen.
func TestLogNothingNewIsCheap(t *testing.T) {
	ctx := context.Background()
	a := takeOver(t, membucket.New(), "a")
	a.seal()
	db := a.open()
	fillDB(t, db, 10, 100)
	// Just after the write by the database's own mtimes, whatever the machine's pace (the
	// wall clock may be past racyMargin by now on a slow machine).
	var justNow time.Time
	for _, f := range []string{"app.db", "app.db-wal"} {
		fi, err := os.Stat(filepath.Join(a.s.DataDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.ModTime(); m.After(justNow) {
			justNow = m
		}
	}
	justNow = justNow.Add(time.Millisecond)
	if seg, err := a.ship.Next(ctx, justNow); err != nil || seg == nil {
		t.Fatalf("Next = %v, %v", seg, err)
	}
	opens := a.ship.opens
	if seg, err := a.ship.Next(ctx, justNow); err != nil || seg != nil {
		t.Fatalf("Next = %v, %v; want nothing new", seg, err)
	}
	if a.ship.opens != opens+1 {
		t.Fatalf("a signature just after a write was trusted (%d opens, want %d)", a.ship.opens, opens+1)
	}
	for range 3 {
		if seg, err := a.ship.Next(ctx, settled()); err != nil || seg != nil {
			t.Fatalf("Next = %v, %v; want nothing new", seg, err)
		}
	}
	if a.ship.opens != opens+2 {
		t.Fatalf("%d opens for nothing new, want %d: only the first settled Next reads", a.ship.opens, opens+2)
	}
	fillDB(t, db, 1, 100)
	if seg, err := a.ship.Next(ctx, settled()); err != nil || seg == nil {
		t.Fatalf("Next after a commit = %v, %v", seg, err)
	}
}

// TestLogWalksOnlyChangedDirectories: Next reads the data dir's directories again only
// when one changed since its last walk (a stat of each replaces reading it), and a database
// created in the data dir or in a subdirectory is shipped by the next Next all the same; a
// directory stat within racyMargin of its change is not trusted.
func TestLogWalksOnlyChangedDirectories(t *testing.T) {
	ctx := context.Background()
	a := takeOver(t, membucket.New(), "a")
	a.seal()
	fillDB(t, a.open(), 10, 100)
	if err := os.Mkdir(filepath.Join(a.s.DataDir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	next := func(now time.Time) *Segment {
		t.Helper()
		seg, err := a.ship.Next(ctx, now)
		if err != nil {
			t.Fatal(err)
		}
		return seg
	}
	// A directory changed just now (its mtime, whatever the machine's pace): not trusted.
	fi, err := os.Stat(a.s.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	justNow := fi.ModTime().Add(time.Millisecond)
	next(justNow)
	walks := a.ship.walks
	next(justNow)
	if a.ship.walks != walks+1 {
		t.Fatalf("%d walks, want %d: a directory signature within racyMargin of its change was trusted", a.ship.walks, walks+1)
	}
	next(settled())
	walks = a.ship.walks
	for range 3 {
		next(settled())
	}
	if a.ship.walks != walks {
		t.Fatalf("%d walks with no directory changed, want %d", a.ship.walks, walks)
	}
	shipped := func(seg *Segment, path string) bool {
		for _, d := range seg.DBs {
			if d.Path == path {
				return true
			}
		}
		return false
	}
	for _, rel := range []string{"sub/second.db", "third.db"} {
		db := openDB(t, filepath.Join(a.s.DataDir, filepath.FromSlash(rel)))
		fillDB(t, db, 1, 100)
		if seg := next(settled()); seg == nil || !shipped(seg, rel) {
			t.Fatalf("the database %s created since the last walk was not shipped: %+v", rel, seg)
		}
	}
}

// TestLogShipperLeavesItsBaseAlone: a shipper's cuts build each new state of a database in
// memory of their own, or of a state an earlier cut of theirs made and a later one
// replaced (LogShipper.spare), never in its base's: the engine clones the base it handed a
// shipper for the standby's stream, and a cut may run by then. After many cuts the base
// is as it was, and the shipper's state is the database's, page for page.
func TestLogShipperLeavesItsBaseAlone(t *testing.T) {
	ctx := context.Background()
	s := newSyncer(t, membucket.New(), t.TempDir())
	os.MkdirAll(s.DataDir, 0o700)
	p := filepath.Join(s.DataDir, "app.db")
	db := openDB(t, p)
	fillDB(t, db, 50, 100)
	if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	base := s.LogBase()
	was := base.Clone()
	ship := testShipper(t, s.DataDir, nil, base, 1, 1, Claim{Holder: "https://a", Incarnation: "1", Lease: `"l"`})
	for i := range 6 {
		fillDB(t, db, 3+i*20, 100) // the database grows: a spare too small for the next state
		if seg, err := ship.Next(ctx, settled()); err != nil || seg == nil {
			t.Fatalf("cut %d: Next = %v, %v", i, seg, err)
		}
	}
	if !slices.Equal(base.dbs["app.db"].hashes, was.dbs["app.db"].hashes) {
		t.Fatal("the shipper's cuts wrote into its base's page hashes")
	}
	if _, err := db.Exec("PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		t.Fatal(err)
	}
	st := ship.dbs["app.db"]
	want, err := hashImage(p, &DBImage{PageSize: st.img.PageSize, Pages: st.img.Pages})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.hashes, want.hashes) || st.sum != want.sum {
		t.Fatal("after the cuts the shipper's page hashes are not the database's")
	}
}
