package spacestore

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

// fillDB makes a chat-like database: messages with an index, n rows of about rowBytes.
func fillDB(t testing.TB, db *sql.DB, n, rowBytes int) {
	t.Helper()
	for _, q := range []string{
		"CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, room INTEGER, created_at INTEGER, body BLOB)",
		"CREATE INDEX IF NOT EXISTS by_room ON messages (room, created_at)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, rowBytes)
	for i := range n {
		rand.Read(body)
		if _, err := tx.Exec("INSERT INTO messages (room, created_at, body) VALUES (?, ?, ?)", i%17, time.Now().UnixNano(), body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func rows(t *testing.T, p string) int {
	t.Helper()
	db := openDB(t, p)
	defer db.Close()
	var ok string
	if err := db.QueryRow("PRAGMA integrity_check").Scan(&ok); err != nil || ok != "ok" {
		t.Fatalf("integrity of %s = %q, %v", p, ok, err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM messages").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// restoreInto restores the bucket's current manifest of s.test into a fresh syncer.
func restoreInto(t *testing.T, b bucket.Bucket) *Syncer {
	t.Helper()
	r := newSyncer(t, b, t.TempDir())
	if err := r.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.Restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestCheckpointCostsWhatChanged: one row added to a multi-MiB database uploads one small
// delta, and every state along a long chain of deltas (merges, rebases) restores exactly, in
// WAL and in rollback-journal mode.
func TestCheckpointCostsWhatChanged(t *testing.T) {
	for _, mode := range []string{"WAL", "DELETE"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			b := backends["file"](t)
			s := newSyncer(t, b, t.TempDir())
			os.MkdirAll(s.DataDir, 0o700)
			p := filepath.Join(s.DataDir, "app.db")
			db, err := sql.Open("sqlite", "file:"+p+"?_pragma=journal_mode("+mode+")&_pragma=busy_timeout(10000)")
			if err != nil {
				t.Fatal(err)
			}
			db.SetMaxOpenConns(1)
			defer db.Close()
			fillDB(t, db, 4000, 1000) // ~5 MB
			st, err := s.Checkpoint(ctx, Periodic, nil, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			size := s.manifest.Files[0].Size
			if st.BytesUploaded < size {
				t.Fatalf("first checkpoint uploaded %d bytes, want the whole %d", st.BytesUploaded, size)
			}
			want := 4000
			for i := range 80 {
				fillDB(t, db, 1, 1000)
				want++
				st, err := s.Checkpoint(ctx, Periodic, nil, time.Now())
				if err != nil {
					t.Fatal(err)
				}
				img := s.manifest.Files[0].Content.DB
				if len(img.Deltas) > (deltaFanout-1)*(maxLevel+1) {
					t.Fatalf("chain of %d deltas", len(img.Deltas))
				}
				if i == 0 && (st.BytesUploaded > 64<<10 || st.BlobsUploaded != 1) {
					t.Fatalf("one row uploaded %d bytes in %d objects, want one delta of a few KiB", st.BytesUploaded, st.BlobsUploaded)
				}
				if mode == "WAL" && i > 0 && st.FullScans != 0 {
					t.Fatalf("checkpoint %d read the whole database; the WAL tail was enough", i)
				}
				if i%9 == 0 || i == 79 {
					r := restoreInto(t, b)
					if got := rows(t, filepath.Join(r.DataDir, "app.db")); got != want {
						t.Fatalf("after %d checkpoints restored %d rows, want %d", i+1, got, want)
					}
				}
			}
		})
	}
}

// TestCheckpointAfterWakeContinuesTheChain: a box that restored a page image checkpoints on
// top of it without uploading the database again.
func TestCheckpointAfterWakeContinuesTheChain(t *testing.T) {
	ctx := context.Background()
	b := backends["file"](t)
	s := newSyncer(t, b, t.TempDir())
	os.MkdirAll(s.DataDir, 0o700)
	db := openDB(t, filepath.Join(s.DataDir, "app.db"))
	fillDB(t, db, 3000, 1000)
	if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	db.Close()
	r := restoreInto(t, b)
	rdb := openDB(t, filepath.Join(r.DataDir, "app.db"))
	fillDB(t, rdb, 1, 1000)
	st, err := r.Checkpoint(ctx, Periodic, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.BytesUploaded > 64<<10 {
		t.Fatalf("first checkpoint after a wake uploaded %d bytes", st.BytesUploaded)
	}
	rdb.Close()
	if got := rows(t, filepath.Join(restoreInto(t, b).DataDir, "app.db")); got != 3001 {
		t.Fatalf("restored %d rows, want 3001", got)
	}
}

// TestSmallChangeToLargeFileUploadsAFewChunks: content-defined chunks survive an insertion.
func TestSmallChangeToLargeFileUploadsAFewChunks(t *testing.T) {
	if !cdcPol.Irreducible() {
		t.Fatal("chunker polynomial is reducible")
	}
	ctx := context.Background()
	b := backends["file"](t)
	s := newSyncer(t, b, t.TempDir())
	os.MkdirAll(s.DataDir, 0o700)
	data := make([]byte, 16<<20)
	rand.Read(data)
	p := filepath.Join(s.DataDir, "big.bin")
	os.WriteFile(p, data, 0o600)
	if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	edited := append(append(bytes.Clone(data[:5<<20]), []byte("a few inserted bytes")...), data[5<<20:]...)
	os.WriteFile(p, edited, 0o600)
	st, err := s.Checkpoint(ctx, Periodic, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.BytesUploaded > 3*cdcMax {
		t.Fatalf("an insertion into 16 MiB uploaded %d bytes in %d chunks", st.BytesUploaded, st.BlobsUploaded)
	}
	got, err := os.ReadFile(filepath.Join(restoreInto(t, b).DataDir, "big.bin"))
	if err != nil || !bytes.Equal(got, edited) {
		t.Fatalf("restored file differs (%v)", err)
	}
}

// copyFixture copies the format-1 bucket written by main's Syncer into a temp dir.
func copyFixture(t *testing.T) bucket.Bucket {
	t.Helper()
	dst := t.TempDir()
	err := os.CopyFS(dst, os.DirFS("testdata/v1bucket"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := filebucket.New(dst)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFormat1BucketKeepsWorking: a bucket written by the full-file code restores, migrates
// on the first checkpoint that changes something, and old blobs are collected only once no
// retained manifest references them.
func TestFormat1BucketKeepsWorking(t *testing.T) {
	ctx := context.Background()
	b := copyFixture(t)
	s := &Syncer{Bucket: b, Host: "old.test", DataDir: filepath.Join(t.TempDir(), "data"), WorkDir: filepath.Join(t.TempDir(), "work"), WrittenBy: "box"}
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if s.manifest.Format != 0 || s.manifest.Generation != 2 {
		t.Fatalf("fixture manifest = format %d gen %d", s.manifest.Format, s.manifest.Generation)
	}
	p := filepath.Join(s.DataDir, "app.db")
	db := openDB(t, p)
	var n int
	if err := db.QueryRow("SELECT count(*) FROM msgs").Scan(&n); err != nil || n != 201 {
		t.Fatalf("fixture db has %d rows (%v), want 201", n, err)
	}
	if note, _ := os.ReadFile(filepath.Join(s.DataDir, "sub", "notes.txt")); string(note) != "written by the v1 code\n" {
		t.Fatalf("notes.txt = %q", note)
	}
	// Nothing changed: nothing written, the bucket stays format 1.
	st, err := s.Checkpoint(ctx, Periodic, nil, time.Now())
	if err != nil || st.ManifestWritten {
		t.Fatalf("unchanged checkpoint = %+v, %v", st, err)
	}
	if _, err := db.Exec("INSERT INTO msgs(body) VALUES('the first v2 message')"); err != nil {
		t.Fatal(err)
	}
	st, err = s.Checkpoint(ctx, Periodic, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.BlobsUploaded != 1 {
		t.Fatalf("migrating checkpoint uploaded %d objects, want one", st.BlobsUploaded)
	}
	m, _, err := ReadManifest(ctx, b, "old.test")
	if err != nil || m.Format != Format || m.Generation != 3 {
		t.Fatalf("migrated manifest = %+v, %v", m, err)
	}
	if m.Files[1].Content != nil || !strings.HasPrefix(m.Refs()[len(m.Refs())-1].Key, "blobs/") {
		t.Fatalf("unchanged notes.txt should keep its format-1 blob: %+v", m.Files[1])
	}
	db.Close()
	r := &Syncer{Bucket: b, Host: "old.test", DataDir: filepath.Join(t.TempDir(), "data"), WorkDir: filepath.Join(t.TempDir(), "work")}
	r.Load(ctx)
	if err := r.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := openDB(t, filepath.Join(r.DataDir, "app.db"))
	if err := rdb.QueryRow("SELECT count(*) FROM msgs").Scan(&n); err != nil || n != 202 {
		t.Fatalf("migrated db has %d rows (%v), want 202", n, err)
	}
	// GC (with no grace: the fixture's blobs are old) deletes the format-1 database blobs,
	// which no format-2 manifest references (so small a database is rebased at once), and
	// keeps the new image and notes.txt's blob.
	gs, err := collectNow(ctx, b, "old.test")
	if err != nil {
		t.Fatal(err)
	}
	if gs.Deleted != 2 || gs.Objects != 2 {
		t.Fatalf("GC deleted %d objects and kept %d, want 2 and 2 (image, notes): %+v", gs.Deleted, gs.Objects, gs)
	}
	after := &Syncer{Bucket: b, Host: "old.test", DataDir: filepath.Join(t.TempDir(), "data"), WorkDir: filepath.Join(t.TempDir(), "work")}
	after.Load(ctx)
	if err := after.Restore(ctx); err != nil {
		t.Fatalf("restore after GC: %v", err)
	}
	if _, err := b.Head(ctx, RefKey("old.test", m.Files[1].refs()[0])); err != nil {
		t.Fatalf("GC deleted a referenced format-1 blob: %v", err)
	}
}

// TestFormat1DatabaseMigratesWithADelta: a large database written whole by the full-file
// mode becomes the base of a page image, so the first change after the upgrade uploads a
// delta, not the database.
func TestFormat1DatabaseMigratesWithADelta(t *testing.T) {
	ctx := context.Background()
	b := backends["file"](t)
	old := newSyncer(t, b, t.TempDir())
	old.FullFile = true
	os.MkdirAll(old.DataDir, 0o700)
	db := openDB(t, filepath.Join(old.DataDir, "app.db"))
	fillDB(t, db, 4000, 1000)
	if _, err := old.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s := restoreInto(t, b)
	sdb := openDB(t, filepath.Join(s.DataDir, "app.db"))
	fillDB(t, sdb, 1, 1000)
	st, err := s.Checkpoint(ctx, Periodic, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.BlobsUploaded != 1 || st.BytesUploaded > 64<<10 {
		t.Fatalf("first checkpoint after the upgrade uploaded %d bytes in %d objects, want one small delta", st.BytesUploaded, st.BlobsUploaded)
	}
	if got := rows(t, filepath.Join(restoreInto(t, b).DataDir, "app.db")); got != 4001 {
		t.Fatalf("restored %d rows, want 4001", got)
	}
}

// collectNow collects with no grace period.
func collectNow(ctx context.Context, b bucket.Bucket, host string) (GCStats, error) {
	return Collect(ctx, b, host, time.Hour, -time.Hour, nil)
}

func listKeys(t *testing.T, b bucket.Bucket, prefix string) map[string]bool {
	t.Helper()
	objs, err := listAll(context.Background(), b, prefix)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]bool)
	for _, o := range objs {
		out[o.Key] = true
	}
	return out
}

// TestCheckpointFollowsWALResetsAndRewrites: the instance checkpointing its WAL (passive:
// backfilled, same WAL; truncate: a new WAL), vacuuming (the file shrinks) or replacing the
// database file between checkpoints never hides a change.
func TestCheckpointFollowsWALResetsAndRewrites(t *testing.T) {
	ctx := context.Background()
	b := backends["file"](t)
	s := newSyncer(t, b, t.TempDir())
	os.MkdirAll(s.DataDir, 0o700)
	p := filepath.Join(s.DataDir, "app.db")
	db := openDB(t, p)
	fillDB(t, db, 2000, 1000)
	step := func(what string, change func()) {
		t.Helper()
		change()
		if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		var n int
		db.QueryRow("SELECT count(*) FROM messages").Scan(&n)
		if got := rows(t, filepath.Join(restoreInto(t, b).DataDir, "app.db")); got != n {
			t.Fatalf("%s: restored %d rows, the database has %d", what, got, n)
		}
	}
	step("first", func() {})
	step("append", func() { fillDB(t, db, 3, 1000) })
	step("passive checkpoint, then writes", func() {
		db.Exec("PRAGMA wal_checkpoint(PASSIVE)")
		fillDB(t, db, 3, 1000)
	})
	step("truncate checkpoint, then writes", func() {
		db.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
		fillDB(t, db, 3, 1000)
	})
	step("truncate checkpoint only", func() { db.Exec("PRAGMA wal_checkpoint(TRUNCATE)") })
	step("restart checkpoint, then a delete", func() {
		db.Exec("PRAGMA wal_checkpoint(RESTART)")
		db.Exec("DELETE FROM messages WHERE id % 3 = 0")
	})
	step("vacuum", func() {
		if _, err := db.Exec("VACUUM"); err != nil {
			t.Fatal(err)
		}
	})
	step("writes after vacuum", func() { fillDB(t, db, 5, 1000) })
	step("file replaced", func() {
		db.Close()
		tmp := filepath.Join(s.DataDir, "new.db")
		ndb := openDB(t, tmp)
		fillDB(t, ndb, 10, 1000)
		ndb.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
		ndb.Close()
		os.Remove(p + "-wal")
		os.Remove(p + "-shm")
		if err := os.Rename(tmp, p); err != nil {
			t.Fatal(err)
		}
		db = openDB(t, p)
	})
}
