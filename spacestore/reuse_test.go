package spacestore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
)

// objGets counts the GETs of a space's objects (not its manifest or lease).
type objGets struct {
	bucket.Bucket
	n atomic.Int64
}

func (c *objGets) Get(ctx context.Context, key string) (*bucket.Object, error) {
	if strings.Contains(key, "/objs/") || strings.Contains(key, "/blobs/") {
		c.n.Add(1)
	}
	return c.Bucket.Get(ctx, key)
}

// sleptSpace is a space that ran on this box (state dir dir) and slept: a WAL database and a
// plain file in a subdirectory, a few periodic checkpoints, then the instance stopped and the
// final checkpoint ran. It returns the syncer and the rows in the database.
func sleptSpace(t *testing.T, b bucket.Bucket, dir string) (*Syncer, int) {
	t.Helper()
	ctx := context.Background()
	s := newSyncer(t, b, dir)
	os.MkdirAll(filepath.Join(s.DataDir, "notes"), 0o700)
	os.WriteFile(filepath.Join(s.DataDir, "notes", "a.txt"), bytes.Repeat([]byte("note "), 50000), 0o640)
	db := openDB(t, filepath.Join(s.DataDir, "app.db"))
	fillDB(t, db, 2000, 1000)
	for range 3 {
		if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
		fillDB(t, db, 1, 1000)
	}
	db.Close() // the instance stops
	st, err := s.Checkpoint(ctx, Final, nil, time.Now())
	if err != nil || st.ReuseErr != nil {
		t.Fatalf("final checkpoint: %v; reuse: %v", err, st.ReuseErr)
	}
	return s, 2003
}

// wake loads and restores with a syncer on state dir dir, as the engine does (a fresh one:
// the box may have restarted since the sleep), and reports whether the data dir was kept and
// how many objects were read.
func wake(t *testing.T, b *objGets, dir string) (*Syncer, bool, int64) {
	t.Helper()
	ctx := context.Background()
	s := newSyncer(t, b, dir)
	b.n.Store(0)
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.reusePath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("reuse record still there after a wake: %v", err)
	}
	return s, s.Reused(), b.n.Load()
}

// sameAsManifest checks that dir's data dir holds exactly the bucket's current manifest:
// a restore elsewhere yields the same files.
func sameAsManifest(t *testing.T, b bucket.Bucket, s *Syncer) {
	t.Helper()
	ref := restoreInto(t, b)
	want, got := treeOf(t, ref.DataDir), treeOf(t, s.DataDir)
	if len(want) != len(got) {
		t.Fatalf("data dir has %d files, manifest %d", len(got), len(want))
	}
	for p, w := range want {
		if !bytes.Equal(got[p], w) {
			t.Fatalf("%s differs from the manifest's", p)
		}
	}
}

func treeOf(t *testing.T, root string) map[string][]byte {
	t.Helper()
	out := make(map[string][]byte)
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			b, err := os.ReadFile(p)
			if err != nil && d.Type().IsRegular() {
				t.Fatal(err)
			}
			out[rel] = b
		}
		return nil
	})
	return out
}

// TestWakeAfterSleepReusesDataDir: a wake on the box the space slept on reads no object,
// and the instance finds what it left; the next checkpoint still costs what changed.
func TestWakeAfterSleepReusesDataDir(t *testing.T) {
	ctx := context.Background()
	b := &objGets{Bucket: backends["file"](t)}
	dir := t.TempDir()
	_, n := sleptSpace(t, b, dir)
	s, reused, gets := wake(t, b, dir)
	if !reused || gets != 0 {
		t.Fatalf("wake on the same box: reused %v, %d object GETs; want the data dir kept, 0 GETs", reused, gets)
	}
	if got := rows(t, filepath.Join(s.DataDir, "app.db")); got != n {
		t.Fatalf("rows = %d, want %d", got, n)
	}
	sameAsManifest(t, b, s)
	// The page hashes are seeded: one more row is one small delta.
	db := openDB(t, filepath.Join(s.DataDir, "app.db"))
	fillDB(t, db, 1, 1000)
	st, err := s.Checkpoint(ctx, Periodic, nil, time.Now())
	if err != nil || !st.ManifestWritten || st.BytesUploaded > 64<<10 {
		t.Fatalf("checkpoint after a reused wake = %+v, %v", st, err)
	}
	db.Close()
	if got := rows(t, filepath.Join(restoreInto(t, b).DataDir, "app.db")); got != n+1 {
		t.Fatalf("restored rows = %d, want %d", got, n+1)
	}
	// The same syncer (the box did not restart) reuses too.
	if st, err := s.Checkpoint(ctx, Final, nil, time.Now()); err != nil || st.ReuseErr != nil {
		t.Fatalf("final checkpoint: %v, %v", err, st.ReuseErr)
	}
	b.n.Store(0)
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(ctx); err != nil || !s.Reused() || b.n.Load() != 0 {
		t.Fatalf("second wake: %v, reused %v, %d GETs", err, s.Reused(), b.n.Load())
	}
}

// TestWakeRestoresInFullWhenInDoubt: anything that may make the data dir differ from the
// manifest being restored -- a crash, another writer, a point-in-time restore, a fenced-out
// final checkpoint, a removed space, or any change to the data dir after the sleep -- gets a
// full restore, which yields exactly the manifest.
func TestWakeRestoresInFullWhenInDoubt(t *testing.T) {
	ctx := context.Background()
	addRow := func(t *testing.T, dir string) {
		db := openDB(t, filepath.Join(dir, "app.db"))
		fillDB(t, db, 1, 1000)
		db.Close()
	}
	otherBox := func(t *testing.T, b bucket.Bucket) {
		o := restoreInto(t, b)
		addRow(t, o.DataDir)
		if _, err := o.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	data := func(s *Syncer, p string) string { return filepath.Join(s.DataDir, filepath.FromSlash(p)) }
	cases := map[string]func(t *testing.T, b bucket.Bucket, s *Syncer){
		"crash (no final checkpoint)": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			// The next wake here restored (or reused), ran, checkpointed, and the box died.
			if err := s.Load(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.Restore(ctx); err != nil {
				t.Fatal(err)
			}
			addRow(t, s.DataDir)
			if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
				t.Fatal(err)
			}
			addRow(t, s.DataDir) // never checkpointed
		},
		"newer generation from another box": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			otherBox(t, b)
		},
		"point-in-time restore": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			if _, err := RestoreTo(ctx, b, "s.test", Holder{ID: "cli:test", Incarnation: "1"}, Target{Generation: 2}, time.Hour, time.Now()); err != nil {
				t.Fatal(err)
			}
		},
		"fenced-out final checkpoint": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			otherBox(t, b)
			addRow(t, s.DataDir) // this box ran on with a stale lease, and its sleep is fenced
			_, err := s.Checkpoint(ctx, Final, nil, time.Now())
			if !errors.Is(err, ErrFenced) {
				t.Fatalf("stale final checkpoint = %v, want ErrFenced", err)
			}
		},
		"space removed": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			os.RemoveAll(s.DataDir)
		},
		"file appended": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			f, _ := os.OpenFile(data(s, "notes/a.txt"), os.O_WRONLY|os.O_APPEND, 0)
			f.WriteString("x")
			f.Close()
		},
		"file rewritten in place, size and mtime kept": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			p := data(s, "notes/a.txt")
			fi, _ := os.Stat(p)
			f, _ := os.OpenFile(p, os.O_WRONLY, 0)
			f.WriteAt([]byte("X"), 10)
			f.Close()
			os.Chtimes(p, fi.ModTime(), fi.ModTime())
		},
		"database page changed, mtime kept": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			p := data(s, "app.db")
			fi, _ := os.Stat(p)
			f, _ := os.OpenFile(p, os.O_WRONLY, 0)
			f.WriteAt([]byte{0}, fi.Size()-100)
			f.Close()
			os.Chtimes(p, fi.ModTime(), fi.ModTime())
		},
		"file touched": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			fi, _ := os.Stat(data(s, "app.db"))
			os.Chtimes(data(s, "app.db"), fi.ModTime(), fi.ModTime())
		},
		"file chmodded": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			os.Chmod(data(s, "notes/a.txt"), 0o600)
			os.Chmod(data(s, "notes/a.txt"), 0o640)
		},
		"file added": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			os.WriteFile(data(s, "notes/b.txt"), []byte("new"), 0o600)
		},
		"file removed": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			os.Remove(data(s, "notes/a.txt"))
		},
		"file replaced by a copy": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			p := data(s, "notes/a.txt")
			body, _ := os.ReadFile(p)
			fi, _ := os.Stat(p)
			os.WriteFile(p+".tmp", body, 0o640)
			os.Chtimes(p+".tmp", fi.ModTime(), fi.ModTime())
			os.Rename(p+".tmp", p)
		},
		"file replaced by a symlink": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			p := data(s, "notes/a.txt")
			os.Rename(p, filepath.Join(s.WorkDir, "elsewhere"))
			os.Symlink(filepath.Join(s.WorkDir, "elsewhere"), p)
		},
		"directory replaced by a symlink": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			p := data(s, "notes")
			os.Rename(p, filepath.Join(s.WorkDir, "notes"))
			os.Symlink(filepath.Join(s.WorkDir, "notes"), p)
		},
		"hard link added": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			os.Link(data(s, "app.db"), filepath.Join(s.WorkDir, "link"))
		},
		"sqlite WAL left beside the database": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			os.WriteFile(data(s, "app.db-wal"), nil, 0o600)
		},
		"empty directory added": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			os.Mkdir(data(s, "empty"), 0o700)
		},
		"machine rebooted": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			body, _ := os.ReadFile(s.reusePath())
			boot, _ := bootID()
			if !bytes.Contains(body, []byte(boot)) {
				t.Fatal("setup: the record has no boot id")
			}
			os.WriteFile(s.reusePath(), bytes.Replace(body, []byte(boot), []byte("00000000-0000-0000-0000-000000000000"), 1), 0o600)
		},
		"record tampered": func(t *testing.T, b bucket.Bucket, s *Syncer) {
			os.WriteFile(s.reusePath(), []byte("{"), 0o600)
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			b := &objGets{Bucket: backends["file"](t)}
			dir := t.TempDir()
			s, _ := sleptSpace(t, b, dir)
			change(t, b, s)
			w, reused, gets := wake(t, b, dir)
			if reused || gets == 0 {
				t.Fatalf("reused %v with %d object GETs; want a full restore", reused, gets)
			}
			sameAsManifest(t, b, w)
		})
	}
}

// TestWakeOnAnotherBoxUnaffected: a box with its own state dir restores in full, and a
// full-file syncer never reuses.
func TestWakeOnAnotherBoxUnaffected(t *testing.T) {
	b := &objGets{Bucket: backends["file"](t)}
	sleptSpace(t, b, t.TempDir())
	w, reused, gets := wake(t, b, t.TempDir())
	if reused || gets == 0 {
		t.Fatalf("wake on another box: reused %v, %d GETs", reused, gets)
	}
	sameAsManifest(t, b, w)

	ctx := context.Background()
	dir := t.TempDir()
	s := newSyncer(t, b, dir)
	s.FullFile = true
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkpoint(ctx, Final, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.reusePath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("full-file mode left a reuse record: %v", err)
	}
}

// TestFinalCheckpointRereadsRacyFiles: a write that lands in the same timestamp tick as a
// periodic checkpoint's look at a file leaves its fingerprint as the checkpoint cached it,
// with the old content. The final checkpoint reads such a file again, so the manifest (and
// the data dir the next wake keeps) hold what the instance last wrote.
func TestFinalCheckpointRereadsRacyFiles(t *testing.T) {
	ctx := context.Background()
	b := &objGets{Bucket: backends["file"](t)}
	dir := t.TempDir()
	s := newSyncer(t, b, dir)
	os.MkdirAll(s.DataDir, 0o700)
	p := filepath.Join(s.DataDir, "a.txt")
	os.WriteFile(p, bytes.Repeat([]byte("1"), 100000), 0o600)
	if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	var old File
	for _, f := range s.hashes {
		old = f
	}
	os.WriteFile(p, bytes.Repeat([]byte("2"), 100000), 0o600)
	// As if the periodic checkpoint had taken this fingerprint, then read the file just
	// before the write: the cache maps the current fingerprint to the old content.
	fp, err := fingerprint(s.DataDir, "a.txt")
	if err != nil {
		t.Fatal(err)
	}
	s.hashes = map[string]File{fp: old}
	s.readAt = map[string]time.Time{fp: time.Now()}
	st, err := s.Checkpoint(ctx, Final, nil, time.Now())
	if err != nil || st.ReuseErr != nil {
		t.Fatalf("final checkpoint: %v, %v", err, st.ReuseErr)
	}
	w, reused, _ := wake(t, b, dir)
	if !reused {
		t.Fatal("wake after the final checkpoint did not keep the data dir")
	}
	sameAsManifest(t, b, w)
}

// TestWakeAfterKilledInstanceReusesDataDir: an instance killed before it closed its database
// leaves a WAL; the final checkpoint's own connection moves it into the database file on
// closing. The record still stands (every page compared with what the checkpoint read), and
// the wake finds every row. A page changed behind the checkpoint's back is refused.
func TestWakeAfterKilledInstanceReusesDataDir(t *testing.T) {
	ctx := context.Background()
	b := &objGets{Bucket: backends["file"](t)}
	src := t.TempDir()
	db := openDB(t, filepath.Join(src, "app.db"))
	if _, err := db.Exec("PRAGMA wal_autocheckpoint=0"); err != nil {
		t.Fatal(err)
	}
	fillDB(t, db, 500, 1000)
	dir := t.TempDir()
	s := newSyncer(t, b, dir)
	os.MkdirAll(s.DataDir, 0o700)
	// The files as a kill leaves them: the WAL holds every row, the database file none.
	for _, n := range []string{"app.db", "app.db-wal", "app.db-shm"} {
		body, err := os.ReadFile(filepath.Join(src, n))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(s.DataDir, n), body, 0o600)
	}
	db.Close()
	if fi, _ := os.Stat(filepath.Join(s.DataDir, "app.db-wal")); fi == nil || fi.Size() == 0 {
		t.Fatal("setup: no WAL left beside the database")
	}
	st, err := s.Checkpoint(ctx, Final, nil, time.Now())
	if err != nil || st.ReuseErr != nil {
		t.Fatalf("final checkpoint: %v, reuse: %v", err, st.ReuseErr)
	}
	// A byte of the database changed after the checkpoint read it (as if written behind
	// its back before the record): no record.
	p := filepath.Join(s.DataDir, "app.db")
	body, _ := os.ReadFile(p)
	body[len(body)-1] ^= 0xff
	os.WriteFile(p, body, 0o600)
	if err := s.recordReuse(); err == nil {
		t.Fatal("a record for a database whose page changed after the checkpoint read it")
	}
	body[len(body)-1] ^= 0xff
	os.WriteFile(p, body, 0o600)
	if err := s.recordReuse(); err != nil {
		t.Fatalf("record for the database as the checkpoint read it: %v", err)
	}
	w, reused, gets := wake(t, b, dir)
	if !reused || gets != 0 {
		t.Fatalf("wake: reused %v, %d GETs", reused, gets)
	}
	if n := rows(t, filepath.Join(w.DataDir, "app.db")); n != 500 {
		t.Fatalf("rows = %d, want 500", n)
	}
	sameAsManifest(t, b, w)
}

// TestWarmCopyIsReusedByTheNextWake: a standby box that warmed a space (Syncer.Warm: the
// manifest restored and recorded) takes it over without reading an object, with what the
// holder checkpointed; a second Warm of the same manifest downloads nothing; a holder's
// checkpoint after the warming makes the copy stale, and the wake restores in full.
func TestWarmCopyIsReusedByTheNextWake(t *testing.T) {
	ctx := context.Background()
	b := &objGets{Bucket: backends["file"](t)}
	holder, n := sleptSpace(t, b, t.TempDir())
	standbyDir := t.TempDir()
	warm := func() bool {
		t.Helper()
		s := newSyncer(t, b, standbyDir)
		if err := s.Load(ctx); err != nil {
			t.Fatal(err)
		}
		fetched, err := s.Warm(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return fetched > 0
	}
	if !warm() {
		t.Fatal("the first Warm on an empty box downloaded nothing")
	}
	if warm() {
		t.Fatal("a second Warm of the same manifest downloaded it again")
	}
	s, reused, gets := wake(t, b, standbyDir)
	if !reused || gets != 0 {
		t.Fatalf("takeover on the warm box: reused %v, %d object GETs; want the warm copy kept, 0 GETs", reused, gets)
	}
	if got := rows(t, filepath.Join(s.DataDir, "app.db")); got != n {
		t.Fatalf("rows = %d, want %d", got, n)
	}
	sameAsManifest(t, b, s)

	// Stale: the holder checkpoints after the standby warmed.
	if !warm() {
		t.Fatal("Warm after a wake consumed the record downloaded nothing")
	}
	if err := holder.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := holder.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	db := openDB(t, filepath.Join(holder.DataDir, "app.db"))
	fillDB(t, db, 1, 1000)
	db.Close()
	if _, err := holder.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	s, reused, gets = wake(t, b, standbyDir)
	if reused || gets == 0 {
		t.Fatalf("takeover after a newer checkpoint: reused %v, %d GETs; want a full restore", reused, gets)
	}
	if got := rows(t, filepath.Join(s.DataDir, "app.db")); got != n+1 {
		t.Fatalf("rows = %d, want %d", got, n+1)
	}
}

// TestWarmOverAnOlderCheckpointFetchesWhatChanged: a standby's copy of one checkpoint,
// warmed again at the holder's next checkpoints, downloads what changed and not the space:
// a database with the same base gets its deltas only, an unchanged file nothing, a new or
// changed file itself, a removed file goes; the result is exactly the manifest, and the
// takeover after it downloads nothing. A copy changed behind the record, or a database
// whose base changed (a fold), is restored in full and still exact.
func TestWarmOverAnOlderCheckpointFetchesWhatChanged(t *testing.T) {
	ctx := context.Background()
	b := &objGets{Bucket: backends["file"](t)}
	holder, n := sleptSpace(t, b, t.TempDir())
	if err := holder.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := holder.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	standbyDir := t.TempDir()
	var gets int64 // objects the last warming read
	warm := func() int64 {
		t.Helper()
		s := newSyncer(t, b, standbyDir)
		if err := s.Load(ctx); err != nil {
			t.Fatal(err)
		}
		before := b.n.Load()
		fetched, err := s.Warm(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gets = b.n.Load() - before
		sameAsManifest(t, b, s)
		return fetched
	}
	checkpoint := func(change func(dir string)) {
		t.Helper()
		change(holder.DataDir)
		if _, err := holder.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	full := warm()
	if full < 1<<20 {
		t.Fatalf("the first warming fetched %d bytes, want the whole space", full)
	}
	db := openDB(t, filepath.Join(holder.DataDir, "app.db"))
	defer db.Close()
	checkpoint(func(dir string) {
		fillDB(t, db, 3, 1000)
		os.WriteFile(filepath.Join(dir, "notes", "b.txt"), []byte("new"), 0o640)
	})
	if got := warm(); got == 0 || got > 64<<10 {
		t.Fatalf("warming over the last checkpoint fetched %d bytes (the whole space: %d), want its change only", got, full)
	}
	checkpoint(func(dir string) {
		fillDB(t, db, 1, 1000)
		os.Remove(filepath.Join(dir, "notes", "a.txt"))
		os.WriteFile(filepath.Join(dir, "c.txt"), []byte("c"), 0o600)
	})
	if got := warm(); got == 0 || got > 64<<10 {
		t.Fatalf("warming over a checkpoint with a file removed fetched %d bytes, want its change only", got)
	}
	// The deltas the copy already had are not fetched again: the new one and c.txt.
	if gets != 2 {
		t.Fatalf("warming over one checkpoint read %d objects, want 2 (one delta, one new file)", gets)
	}
	if _, err := os.Stat(filepath.Join(standbyDir, "data", "notes", "a.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the removed file is still in the copy: %v", err)
	}
	s, reused, gets := wake(t, b, standbyDir)
	if !reused || gets != 0 {
		t.Fatalf("takeover after warming over: reused %v, %d GETs", reused, gets)
	}
	if got := rows(t, filepath.Join(s.DataDir, "app.db")); got != n+4 {
		t.Fatalf("rows = %d, want %d", got, n+4)
	}

	// Changed behind the record: a full restore.
	warm()
	checkpoint(func(string) { fillDB(t, db, 1, 1000) })
	os.WriteFile(filepath.Join(standbyDir, "data", "c.txt"), []byte("x"), 0o600)
	if got := warm(); got < full/2 {
		t.Fatalf("warming a copy changed behind its record fetched %d bytes, want a full restore", got)
	}
	// A fold gives the database a new base: it is fetched whole.
	for range 40 {
		checkpoint(func(string) { fillDB(t, db, 1, 1000) })
	}
	if _, err := holder.Fold(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := warm(); got < full/2 {
		t.Logf("warming after a fold fetched %d bytes", got)
	}
	s, reused, gets = wake(t, b, standbyDir)
	if !reused || gets != 0 {
		t.Fatalf("takeover after a fold: reused %v, %d GETs", reused, gets)
	}
	if got := rows(t, filepath.Join(s.DataDir, "app.db")); got != n+45 {
		t.Fatalf("rows = %d, want %d", got, n+45)
	}
}
