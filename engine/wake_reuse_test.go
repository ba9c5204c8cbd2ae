package engine

import (
	"context"
	"crypto/rand"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

// objectGets counts GETs of space objects (not manifests, leases or heartbeats).
type objectGets struct {
	bucket.Bucket
	n atomic.Int64
}

func (c *objectGets) Get(ctx context.Context, key string) (*bucket.Object, error) {
	if strings.Contains(key, "/objs/") || strings.Contains(key, "/blobs/") {
		c.n.Add(1)
	}
	return c.Bucket.Get(ctx, key)
}

// reuseTestEngine is newAwakeTestEngine on a given bucket, with its own state dir.
func reuseTestEngine(t *testing.T, b bucket.Bucket, holder string) *Engine {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "eng")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e, err := New(Config{
		Bucket: b, StateDir: dir, Holder: holder, Incarnation: "1",
		Kinds: map[string]Kind{"app": {
			Command:     self,
			Env:         map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
			Replication: Replication{Class: ReplicateSleep},
			StopGrace:   5 * time.Second,
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	drainAtEnd(t, e)
	return e
}

// TestWakeAfterSleepKeepsTheDataDir: a space that slept on this box wakes here without
// downloading its objects, and finds its data as it left it; on another box it is restored
// from the bucket.
func TestWakeAfterSleepKeepsTheDataDir(t *testing.T) {
	ctx := context.Background()
	fb, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := &objectGets{Bucket: fb}
	e := reuseTestEngine(t, b, "box-a")
	const host = "reuse.example.com"
	u, err := e.Acquire(ctx, Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	in := e.get(host)
	dbPath := filepath.Join(in.dataDir, "app.db")
	// busy_timeout, as any app needs: the box reads the database under its write lock
	// (the log after each group of commits, checkpoints), and SQLite's default fails at once.
	db, err := sql.Open("sqlite", "file:"+dbPath+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec("CREATE TABLE m (id INTEGER PRIMARY KEY, body BLOB)"); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 1000)
	for range 3000 {
		rand.Read(body)
		if _, err := db.Exec("INSERT INTO m (body) VALUES (?)", body); err != nil {
			t.Fatal(err)
		}
	}
	e.syncNow(ctx, in)
	db.Close()
	u.Release()
	if err := e.Sleep(ctx, host); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(dbPath)
	if err != nil {
		t.Fatal(err)
	}

	b.n.Store(0)
	u, err = e.Acquire(ctx, Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if n := b.n.Load(); n != 0 || !in.syncer.Reused() {
		t.Fatalf("wake on the box it slept on: %d object GETs, reused %v; want 0, true", n, in.syncer.Reused())
	}
	got, err := os.ReadFile(dbPath)
	if err != nil || string(got) != string(want) {
		t.Fatalf("the instance does not find its database as it left it (%v)", err)
	}
	u.Release()
	if err := e.Sleep(ctx, host); err != nil {
		t.Fatal(err)
	}

	// A name added to the data dir while the space slept: the wake restores in full.
	if err := os.WriteFile(filepath.Join(in.dataDir, "stray.txt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	b.n.Store(0)
	u, err = e.Acquire(ctx, Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if n := b.n.Load(); n == 0 || in.syncer.Reused() {
		t.Fatalf("wake after the data dir changed: %d object GETs, reused %v; want a download", n, in.syncer.Reused())
	}
	if _, err := os.Stat(filepath.Join(in.dataDir, "stray.txt")); !os.IsNotExist(err) {
		t.Fatalf("the full restore kept a file the manifest lacks: %v", err)
	}
	if got, err = os.ReadFile(dbPath); err != nil || string(got) != string(want) {
		t.Fatalf("the full restore gave different bytes (%v)", err)
	}
	u.Release()
	if err := e.Sleep(ctx, host); err != nil {
		t.Fatal(err)
	}

	// A discard after a sleep (the record goes with the local state): a full restore.
	if err := e.Discard(ctx, host); err != nil {
		t.Fatal(err)
	}
	b.n.Store(0)
	u, err = e.Acquire(ctx, Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if n := b.n.Load(); n == 0 || e.get(host).syncer.Reused() {
		t.Fatalf("wake after a discard: %d object GETs, reused %v; want a download", n, e.get(host).syncer.Reused())
	}
	u.Release()
	if err := e.Sleep(ctx, host); err != nil {
		t.Fatal(err)
	}

	// Another box (its own state dir) downloads.
	o := reuseTestEngine(t, b, "box-b")
	b.n.Store(0)
	u, err = o.Acquire(ctx, Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Release()
	if n := b.n.Load(); n == 0 || o.get(host).syncer.Reused() {
		t.Fatalf("wake on another box: %d object GETs, reused %v; want a download", n, o.get(host).syncer.Reused())
	}
	got, err = os.ReadFile(filepath.Join(o.get(host).dataDir, "app.db"))
	if err != nil || string(got) != string(want) {
		t.Fatalf("the other box restored different bytes (%v)", err)
	}
}
