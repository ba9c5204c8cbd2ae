package spacestore

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// backends returns every bucket implementation the protocol is tested against; each test
// gets a fresh, empty bucket.
var backends = map[string]func(t *testing.T) bucket.Bucket{
	"file": func(t *testing.T) bucket.Bucket {
		b, err := filebucket.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return b
	},
	"versitygw": func(t *testing.T) bucket.Bucket {
		if testing.Short() {
			t.Skip("versitygw in -short mode")
		}
		return harness.StartS3(t).NewBucket(t, "p/")
	},
}

func forEachBucket(t *testing.T, f func(t *testing.T, b bucket.Bucket)) {
	for name, mk := range backends {
		t.Run(name, func(t *testing.T) { f(t, mk(t)) })
	}
}

func TestLeaseRules(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		now := time.Now()
		live := map[string]bool{"https://a|1": true, "https://b|1": true}
		liveFn := func(h, i string) bool { return live[h+"|"+i] }
		a := Holder{ID: "https://a", Incarnation: "1", Live: liveFn}
		bb := Holder{ID: "https://b", Incarnation: "1", Live: liveFn}

		etagA, err := AcquireLease(ctx, b, "x.test", a, now)
		if err != nil {
			t.Fatalf("first acquire: %v", err)
		}
		var held *LeaseHeldError
		if _, err := AcquireLease(ctx, b, "x.test", bb, now); !errors.As(err, &held) || held.Holder != "https://a" {
			t.Fatalf("acquire of a live other holder's lease = %v, want LeaseHeldError from https://a", err)
		}
		// Same holder and incarnation takes it again (e.g. after local state was dropped).
		etagA2, err := AcquireLease(ctx, b, "x.test", a, now.Add(time.Second))
		if err != nil {
			t.Fatalf("re-acquire by same incarnation: %v", err)
		}
		if _, err := ReleaseLease(ctx, b, "x.test", etagA, a, now); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("release with a stale etag = %v, want ErrLeaseLost", err)
		}
		if _, err := ReleaseLease(ctx, b, "x.test", etagA2, a, now); err != nil {
			t.Fatalf("release: %v", err)
		}
		l, _, err := ReadLease(ctx, b, "x.test")
		if err != nil || !l.Released {
			t.Fatalf("lease after release = %+v, %v; want released", l, err)
		}
		etagB, err := AcquireLease(ctx, b, "x.test", bb, now)
		if err != nil {
			t.Fatalf("acquire of a released lease: %v", err)
		}
		if ok, err := StillHeld(ctx, b, "x.test", etagB, bb); !ok || err != nil {
			t.Fatalf("StillHeld after acquire = %v, %v", ok, err)
		}
		// b dies: its lease is free for a without any write by b.
		live["https://b|1"] = false
		if _, err := AcquireLease(ctx, b, "x.test", a, now); err != nil {
			t.Fatalf("takeover from a dead holder: %v", err)
		}
		if ok, _ := StillHeld(ctx, b, "x.test", etagB, bb); ok {
			t.Fatal("StillHeld true for the holder whose lease was taken over")
		}
		// A restarted box (new incarnation, no liveness view) may take its old lease.
		a2 := Holder{ID: "https://a", Incarnation: "2"}
		if _, err := AcquireLease(ctx, b, "x.test", a2, now); err != nil {
			t.Fatalf("takeover by a new incarnation: %v", err)
		}
	})
}

func TestLeaseRaceOneWinner(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		live := func(string, string) bool { return true }
		const n = 16
		var wg sync.WaitGroup
		var mu sync.Mutex
		winners, held := 0, 0
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := AcquireLease(ctx, b, "race.test", Holder{ID: fmt.Sprintf("box%d", i), Incarnation: "1", Live: live}, time.Now())
				mu.Lock()
				defer mu.Unlock()
				var he *LeaseHeldError
				switch {
				case err == nil:
					winners++
				case errors.As(err, &he):
					held++
				default:
					t.Errorf("acquire: %v", err)
				}
			}()
		}
		wg.Wait()
		if winners != 1 || held != n-1 {
			t.Fatalf("winners=%d held=%d, want 1 and %d", winners, held, n-1)
		}
	})
}

func TestManifestFencing(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		m1 := &Manifest{Generation: 1, WrittenBy: "a"}
		etag, err := WriteManifest(ctx, b, "f.test", m1, "")
		if err != nil {
			t.Fatal(err)
		}
		// Another writer's first write. (The same bytes again are this writer's own write
		// landing twice, recognized as such: TestManifestSwapWithLostAnswer.)
		if _, err := WriteManifest(ctx, b, "f.test", &Manifest{Generation: 1, WrittenBy: "b"}, ""); !errors.Is(err, ErrFenced) {
			t.Fatalf("second first-write = %v, want ErrFenced", err)
		}
		foreign := &Manifest{Generation: 7, WrittenBy: "intruder"}
		if _, err := WriteManifest(ctx, b, "f.test", foreign, etag); err != nil {
			t.Fatal(err)
		}
		if _, err := WriteManifest(ctx, b, "f.test", &Manifest{Generation: 2, WrittenBy: "a"}, etag); !errors.Is(err, ErrFenced) {
			t.Fatalf("write on a stale etag = %v, want ErrFenced", err)
		}
		got, _, err := ReadManifest(ctx, b, "f.test")
		if err != nil || got.WrittenBy != "intruder" || got.Generation != 7 {
			t.Fatalf("manifest after fenced write = %+v, %v; want the foreign one intact", got, err)
		}
		if m, etag, err := ReadManifest(ctx, b, "none.test"); m != nil || etag != "" || err != nil {
			t.Fatalf("missing manifest = %v %q %v", m, etag, err)
		}
	})
}

func openDB(t testing.TB, p string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+p+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

func newSyncer(t testing.TB, b bucket.Bucket, dir string) *Syncer {
	return &Syncer{Bucket: b, Host: "s.test", DataDir: filepath.Join(dir, "data"), WorkDir: filepath.Join(dir, "work"), WrittenBy: "box"}
}

func TestCheckpointRestoreWhileWriting(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		src := newSyncer(t, b, t.TempDir())
		if err := src.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if err := src.Restore(ctx); err != nil {
			t.Fatal(err)
		}
		db := openDB(t, filepath.Join(src.DataDir, "app.db"))
		if _, err := db.Exec("CREATE TABLE m (id INTEGER PRIMARY KEY, body TEXT)"); err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Join(src.DataDir, "uploads"), 0o755)
		os.WriteFile(filepath.Join(src.DataDir, "uploads", "a.txt"), []byte("hello"), 0o640)

		// Write continuously while checkpointing: every snapshot must be a consistent db.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := db.Exec("INSERT INTO m (body) VALUES (?)", strings.Repeat("x", 1000)); err != nil {
					t.Errorf("insert: %v", err)
					return
				}
			}
		}()
		for range 3 {
			if _, err := src.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
		close(stop)
		wg.Wait()
		var want int
		db.QueryRow("SELECT count(*) FROM m").Scan(&want)
		st, err := src.Checkpoint(ctx, Periodic, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		m, _ := src.Manifest()
		for _, f := range m.Files {
			if strings.HasSuffix(f.Path, "-wal") || strings.HasSuffix(f.Path, "-shm") {
				t.Fatalf("manifest holds SQLite sidecar %s", f.Path)
			}
		}
		if st.Files != 2 {
			t.Fatalf("checkpoint saw %d files, want 2 (app.db, uploads/a.txt): %+v", st.Files, m.Files)
		}

		dst := newSyncer(t, b, t.TempDir())
		if err := dst.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if err := dst.Restore(ctx); err != nil {
			t.Fatal(err)
		}
		rdb := openDB(t, filepath.Join(dst.DataDir, "app.db"))
		var ok string
		if err := rdb.QueryRow("PRAGMA integrity_check").Scan(&ok); err != nil || ok != "ok" {
			t.Fatalf("restored db integrity = %q, %v", ok, err)
		}
		var got int
		rdb.QueryRow("SELECT count(*) FROM m").Scan(&got)
		if got != want {
			t.Fatalf("restored db has %d rows, want %d", got, want)
		}
		data, err := os.ReadFile(filepath.Join(dst.DataDir, "uploads", "a.txt"))
		if err != nil || string(data) != "hello" {
			t.Fatalf("restored a.txt = %q, %v", data, err)
		}
		if fi, _ := os.Stat(filepath.Join(dst.DataDir, "uploads", "a.txt")); fi.Mode().Perm() != 0o640 {
			t.Fatalf("restored mode %v, want 0640", fi.Mode().Perm())
		}
	})
}

func TestCheckpointUploadsOnlyChanges(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		s := newSyncer(t, b, t.TempDir())
		s.Load(ctx)
		s.Restore(ctx)
		db := openDB(t, filepath.Join(s.DataDir, "app.db"))
		db.Exec("CREATE TABLE m (body TEXT)")
		db.Exec("INSERT INTO m VALUES (?)", strings.Repeat("y", 100000))
		os.WriteFile(filepath.Join(s.DataDir, "big.bin"), []byte(strings.Repeat("z", 200000)), 0o600)
		st, err := s.Checkpoint(ctx, Periodic, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if st.BlobsUploaded != 2 || !st.ManifestWritten {
			t.Fatalf("first checkpoint %+v, want 2 blobs and a manifest", st)
		}
		_, etag1 := s.Manifest()
		st, err = s.Checkpoint(ctx, Periodic, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if st.BlobsUploaded != 0 || st.BytesUploaded != 0 || st.ManifestWritten {
			t.Fatalf("unchanged checkpoint %+v, want no writes", st)
		}
		if _, etag2 := s.Manifest(); etag2 != etag1 {
			t.Fatal("unchanged checkpoint rewrote the manifest")
		}
		os.WriteFile(filepath.Join(s.DataDir, "small.txt"), []byte("new"), 0o600)
		st, err = s.Checkpoint(ctx, Periodic, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if st.BlobsUploaded != 1 || st.BytesUploaded != 3 {
			t.Fatalf("checkpoint after adding one file %+v, want 1 blob of 3 bytes", st)
		}
		at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
		st, err = s.Checkpoint(ctx, Periodic, &at, time.Now())
		if err != nil || !st.ManifestWritten || st.BlobsUploaded != 0 {
			t.Fatalf("checkpoint with a new next-wake %+v %v, want a manifest write only", st, err)
		}
		m, _, _ := ReadManifest(ctx, b, "s.test")
		if m.NextWake == nil || !m.NextWake.Equal(at) || m.Generation != 3 {
			t.Fatalf("manifest %+v, want generation 3 with next_wake %v", m, at)
		}
	})
}

// TestCheckpointDoesNotFollowSymlinks: a symlink in the data dir never carries the file it
// points to into the bucket; it is skipped (TestCheckpointSkipsOddFiles) and the rest of
// the state is still saved.
func TestCheckpointDoesNotFollowSymlinks(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		s := newSyncer(t, b, t.TempDir())
		os.MkdirAll(s.DataDir, 0o700)
		os.Symlink("/etc/passwd", filepath.Join(s.DataDir, "leak"))
		st, err := s.Checkpoint(ctx, Periodic, nil, time.Now())
		if err != nil || len(st.Skipped) != 1 || st.Skipped[0].Kind != "symlink" {
			t.Fatalf("checkpoint with a symlink = %+v, %v; want it skipped", st, err)
		}
		if m, _, _ := ReadManifest(ctx, b, "s.test"); m == nil || len(m.Files) != 0 {
			t.Fatalf("manifest %+v, want written without the symlink", m)
		}
	})
}

func TestRestoreVerifiesBlobs(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		s := newSyncer(t, b, t.TempDir())
		os.MkdirAll(s.DataDir, 0o700)
		os.WriteFile(filepath.Join(s.DataDir, "f"), []byte("genuine"), 0o600)
		if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
		m, _ := s.Manifest()
		// Tamper with the object.
		if _, err := b.Put(ctx, RefKey("s.test", m.Refs()[0]), strings.NewReader("forged!"), 7, bucket.Cond{}); err != nil {
			t.Fatal(err)
		}
		r := newSyncer(t, b, t.TempDir())
		os.MkdirAll(r.DataDir, 0o700)
		os.WriteFile(filepath.Join(r.DataDir, "keep"), []byte("old"), 0o600)
		r.Load(ctx)
		if err := r.Restore(ctx); err == nil || !strings.Contains(err.Error(), "corrupt") {
			t.Fatalf("restore of a tampered blob = %v, want a corruption error", err)
		}
		if data, err := os.ReadFile(filepath.Join(r.DataDir, "keep")); err != nil || string(data) != "old" {
			t.Fatalf("failed restore touched the data dir: %q %v", data, err)
		}
	})
}

func TestWakeRecords(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		at := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
		etag, err := PutWake(ctx, b, "w.test", at)
		if err != nil {
			t.Fatal(err)
		}
		PutWake(ctx, b, "v.test", at.Add(time.Hour))
		sc := &WakeScanner{Bucket: b}
		recs, now, err := sc.Scan(ctx)
		if err != nil || len(recs) != 2 || now.IsZero() {
			t.Fatalf("scan = %+v %v %v", recs, now, err)
		}
		for _, r := range recs {
			if r.Host == "w.test" && !r.At.Equal(at) {
				t.Fatalf("w.test at %v, want %v", r.At, at)
			}
		}
		// A newer record written after our read survives our conditional delete.
		if _, err := PutWake(ctx, b, "w.test", at.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if err := DeleteWake(ctx, b, "w.test", etag); err == nil {
			t.Fatal("delete with a stale etag succeeded")
		}
		recs, _, _ = sc.Scan(ctx)
		var found bool
		for _, r := range recs {
			if r.Host == "w.test" {
				found = r.At.Equal(at.Add(time.Minute))
				if err := DeleteWake(ctx, b, "w.test", r.ETag); err != nil {
					t.Fatal(err)
				}
			}
		}
		if !found {
			t.Fatalf("scan after rewrite = %+v, want the newer time", recs)
		}
		recs, _, _ = sc.Scan(ctx)
		if len(recs) != 1 || recs[0].Host != "v.test" {
			t.Fatalf("scan after delete = %+v", recs)
		}
	})
}

func TestReadNextWake(t *testing.T) {
	dir := t.TempDir()
	if at, err := ReadNextWake(dir); at != nil || err != nil {
		t.Fatalf("absent = %v %v", at, err)
	}
	os.MkdirAll(filepath.Join(dir, ".lchat"), 0o700)
	os.WriteFile(filepath.Join(dir, ".lchat", "next-wake"), []byte("2030-01-01T00:00:00Z\n"), 0o600)
	at, err := ReadNextWake(dir)
	if err != nil || at == nil || !at.Equal(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("= %v %v", at, err)
	}
	os.WriteFile(filepath.Join(dir, ".lchat", "next-wake"), []byte("tomorrow"), 0o600)
	if _, err := ReadNextWake(dir); err == nil {
		t.Fatal("garbage parsed")
	}
}

// A database the app only opened (WAL mode set, no data changed) after a restore must not
// be uploaded again: VACUUM INTO copies are normalized to depend on content alone.
func TestReopenedDatabaseIsNotUploadedAgain(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		s := newSyncer(t, b, t.TempDir())
		os.MkdirAll(s.DataDir, 0o700)
		db := openDB(t, filepath.Join(s.DataDir, "app.db"))
		db.Exec("CREATE TABLE m (body TEXT)")
		db.Exec("INSERT INTO m VALUES ('kept')")
		db.Close()
		if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
		for round := range 3 {
			r := newSyncer(t, b, t.TempDir())
			if err := r.Load(ctx); err != nil {
				t.Fatal(err)
			}
			if err := r.Restore(ctx); err != nil {
				t.Fatal(err)
			}
			db := openDB(t, filepath.Join(r.DataDir, "app.db"))
			var body string
			if err := db.QueryRow("SELECT body FROM m").Scan(&body); err != nil || body != "kept" {
				t.Fatalf("round %d: restored row %q, %v", round, body, err)
			}
			db.Exec("CREATE TABLE IF NOT EXISTS m (body TEXT)")
			db.Close()
			st, err := r.Checkpoint(ctx, Periodic, nil, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if st.BlobsUploaded != 0 || st.ManifestWritten {
				t.Fatalf("round %d: checkpoint of an unchanged database %+v, want no upload and no manifest write", round, st)
			}
		}
	})
}

// Database file names are the instance's choice. A name with '#', '?' or '%' must be
// snapshotted as itself, not as another (new, empty) file the SQLite URI would name.
func TestCheckpointOddDatabaseNames(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		s := newSyncer(t, b, t.TempDir())
		os.MkdirAll(s.DataDir, 0o700)
		names := []string{"notes#1.db", "what?.db", "50%25off.db", "sp ace.db"}
		for _, name := range names {
			// openDB's own "file:" DSN would mangle these names too: create each under a
			// plain name and rename it into place.
			tmp := filepath.Join(s.DataDir, "tmp.db")
			db := openDB(t, tmp)
			db.Exec("CREATE TABLE m (body TEXT)")
			if _, err := db.Exec("INSERT INTO m VALUES (?)", "row of "+name); err != nil {
				t.Fatal(err)
			}
			db.Close()
			os.Remove(tmp + "-wal")
			os.Remove(tmp + "-shm")
			if err := os.Rename(tmp, filepath.Join(s.DataDir, name)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
		entries, _ := os.ReadDir(s.DataDir)
		if len(entries) != len(names) {
			var got []string
			for _, e := range entries {
				got = append(got, e.Name())
			}
			t.Fatalf("checkpoint changed the data dir: %q, want only %q", got, names)
		}
		r := newSyncer(t, b, t.TempDir())
		if err := r.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.Restore(ctx); err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			db, err := sql.Open("sqlite", sqliteURI(filepath.Join(r.DataDir, name)))
			if err != nil {
				t.Fatal(err)
			}
			var body string
			err = db.QueryRow("SELECT body FROM m").Scan(&body)
			db.Close()
			if err != nil || body != "row of "+name {
				t.Errorf("restored %s: %q, %v; want its row", name, body, err)
			}
		}
	})
}

// Files the instance creates and removes while a checkpoint walks its directory (temporary
// files, renames) are left out of that snapshot; they do not fail it.
func TestCheckpointToleratesFilesVanishing(t *testing.T) {
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s := newSyncer(t, b, t.TempDir())
	os.MkdirAll(filepath.Join(s.DataDir, "tmp"), 0o700)
	os.WriteFile(filepath.Join(s.DataDir, "kept.txt"), []byte("kept"), 0o600)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p := filepath.Join(s.DataDir, "tmp", fmt.Sprintf("f%d-%d", w, i%64))
				os.WriteFile(p, []byte("scratch"), 0o600)
				os.Remove(p)
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	for i := range 100 {
		if _, err := s.Checkpoint(ctx, Periodic, nil, time.Now()); err != nil {
			t.Fatalf("checkpoint %d with files coming and going: %v", i, err)
		}
	}
	m, _ := s.Manifest()
	var kept bool
	for _, f := range m.Files {
		kept = kept || f.Path == "kept.txt"
	}
	if !kept {
		t.Fatalf("manifest lost the stable file: %+v", m.Files)
	}
}

func TestRestoreRefusesUnsafePaths(t *testing.T) {
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, bad := range []string{"../escape", "/etc/evil", "a/../../escape", ".", ""} {
		root := t.TempDir()
		// A manifest written by a buggy or hostile writer; its blob exists.
		body := "payload"
		sum := fmt.Sprintf("%x", sha256Sum(body))
		b.Put(ctx, BlobKey("u.test", sum), strings.NewReader(body), int64(len(body)), bucket.Cond{})
		if _, err := WriteManifest(ctx, b, "u.test", &Manifest{Generation: 1, Files: []File{{Path: bad, Size: 7, SHA256: sum, Mode: 0o600}}}, ""); err != nil {
			// Overwrite the previous iteration's manifest.
			info, _ := b.Head(ctx, ManifestKey("u.test"))
			etag := info.ETag
			if _, err := WriteManifest(ctx, b, "u.test", &Manifest{Generation: 1, Files: []File{{Path: bad, Size: 7, SHA256: sum, Mode: 0o600}}}, etag); err != nil {
				t.Fatal(err)
			}
		}
		r := &Syncer{Bucket: b, Host: "u.test", DataDir: filepath.Join(root, "space", "data"), WorkDir: filepath.Join(root, "space", "work")}
		os.MkdirAll(r.DataDir, 0o700)
		os.WriteFile(filepath.Join(r.DataDir, "keep"), []byte("old"), 0o600)
		// The manifest is refused when it is read (Manifest.Validate); Restore keeps its
		// own check for a manifest that reached it some other way.
		err := r.Load(ctx)
		if err == nil {
			err = r.Restore(ctx)
		}
		if err == nil || !strings.Contains(err.Error(), "invalid path") {
			t.Errorf("restore of a manifest naming %q = %v, want an invalid-path refusal", bad, err)
		}
		if data, err := os.ReadFile(filepath.Join(r.DataDir, "keep")); err != nil || string(data) != "old" {
			t.Errorf("%q: failed restore touched the data dir: %q %v", bad, data, err)
		}
		for _, p := range []string{filepath.Join(root, "space", "escape"), filepath.Join(root, "escape")} {
			if _, err := os.Stat(p); err == nil {
				t.Errorf("%q: restore wrote %s outside the data dir", bad, p)
			}
		}
	}
}

// One unreadable record must not hold back every other space's scheduled wake.
func TestScanSkipsABadWakeRecord(t *testing.T) {
	forEachBucket(t, func(t *testing.T, b bucket.Bucket) {
		ctx := context.Background()
		at := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
		if _, err := PutWake(ctx, b, "good.test", at); err != nil {
			t.Fatal(err)
		}
		junk := "not a time"
		if _, err := b.Put(ctx, WakeKey("bad.test"), strings.NewReader(junk), int64(len(junk)), bucket.Cond{}); err != nil {
			t.Fatal(err)
		}
		recs, now, err := (&WakeScanner{Bucket: b}).Scan(ctx)
		if err == nil || !strings.Contains(err.Error(), "bad.test") {
			t.Errorf("scan error = %v, want one naming bad.test", err)
		}
		if len(recs) != 1 || recs[0].Host != "good.test" || !recs[0].At.Equal(at) || now.IsZero() {
			t.Fatalf("scan with one bad record = %+v at %v, want good.test at %v and the bucket's clock", recs, now, at)
		}
	})
}

func sha256Sum(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// TestCheckpointRefusesAnUnknownMode: a mode outside Periodic, Final and Fold writes nothing.
func TestCheckpointRefusesAnUnknownMode(t *testing.T) {
	b := backends["file"](t)
	s := newSyncer(t, b, t.TempDir())
	if st, err := s.Checkpoint(context.Background(), Fold+1, nil, time.Now()); err == nil || st.ManifestWritten {
		t.Fatalf("checkpoint in mode %v: %+v, %v; want an error", Fold+1, st, err)
	}
	if m, _, err := ReadManifest(context.Background(), b, s.Host); err != nil || m != nil {
		t.Fatalf("manifest after a refused checkpoint: %v, %v", m, err)
	}
}

// TestAcquireLeaseAfterOwnRelease: a box that released the lease takes it back with one
// request while nobody wrote it since; when another box wrote it meanwhile the kept ETag
// is stale and the lease rules decide as for AcquireLease (a live holder keeps it; a
// released lease is taken).
func TestAcquireLeaseAfterOwnRelease(t *testing.T) {
	forEachBucket(t, func(t *testing.T, raw bucket.Bucket) {
		ctx := context.Background()
		now := time.Now()
		live := map[string]bool{"https://a|1": true, "https://b|1": true}
		liveFn := func(h, i string) bool { return live[h+"|"+i] }
		a := Holder{ID: "https://a", Incarnation: "1", Live: liveFn}
		bb := Holder{ID: "https://b", Incarnation: "1", Live: liveFn}
		b := membucket.NewCounting(raw)

		etag, err := AcquireLease(ctx, b, "r.test", a, now)
		if err != nil {
			t.Fatal(err)
		}
		released, err := ReleaseLease(ctx, b, "r.test", etag, a, now)
		if err != nil || released == "" {
			t.Fatalf("release: %q, %v", released, err)
		}
		b.Reset()
		etag, err = AcquireLeaseAfter(ctx, b, "r.test", a, now.Add(time.Second), released)
		if err != nil {
			t.Fatalf("acquire after own release: %v", err)
		}
		if n := b.Total(); n != 1 {
			t.Fatalf("acquire after own release took %d requests (%v), want 1", n, b.Counts())
		}
		if l, cur, _ := ReadLease(ctx, b, "r.test"); cur != etag || l.Released || l.Holder != a.ID {
			t.Fatalf("lease %+v (%s), want held by a (%s)", l, cur, etag)
		}
		released, err = ReleaseLease(ctx, b, "r.test", etag, a, now)
		if err != nil {
			t.Fatal(err)
		}

		// b takes it meanwhile: a's kept ETag is stale, and b is live.
		etagB, err := AcquireLease(ctx, b, "r.test", bb, now)
		if err != nil {
			t.Fatal(err)
		}
		var held *LeaseHeldError
		if _, err := AcquireLeaseAfter(ctx, b, "r.test", a, now, released); !errors.As(err, &held) || held.Holder != bb.ID {
			t.Fatalf("acquire with a stale kept ETag while b holds it: %v, want LeaseHeldError from b", err)
		}
		// b releases: the stale ETag still gets a the lease, through the lease rules.
		if _, err := ReleaseLease(ctx, b, "r.test", etagB, bb, now); err != nil {
			t.Fatal(err)
		}
		if _, err := AcquireLeaseAfter(ctx, b, "r.test", a, now, released); err != nil {
			t.Fatalf("acquire with a stale kept ETag of a released lease: %v", err)
		}
		if l, _, _ := ReadLease(ctx, b, "r.test"); l.Released || l.Holder != a.ID {
			t.Fatalf("lease %+v, want held by a", l)
		}
	})
}
