package engine

import (
	"context"
	"crypto/rand"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/lchat/lchat-caddy/spacestore"
	_ "modernc.org/sqlite"
)

// TestSleepCheckpointFoldsTheChain: the checkpoint a sleep takes once the instance stopped
// leaves the next wake a database's base and at most one delta, however many periodic
// checkpoints built the chain while the space ran.
func TestSleepCheckpointFoldsTheChain(t *testing.T) {
	e := newAwakeTestEngine(t, 0)
	ctx := context.Background()
	const host = "fold.example.com"
	u, err := e.Acquire(ctx, Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	in := e.get(host)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(in.dataDir, "app.db")+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE m (id INTEGER PRIMARY KEY, body BLOB)"); err != nil {
		t.Fatal(err)
	}
	add := func(n int) {
		tx, _ := db.Begin()
		body := make([]byte, 1000)
		for range n {
			rand.Read(body)
			if _, err := tx.Exec("INSERT INTO m (body) VALUES (?)", body); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	add(6000)                        // ~6.5 MB: several base chunks, page 1 in the first
	for range spacestore.FoldChain { // a chain periodic checkpoints leave (no background fold yet)
		e.syncNow(ctx, in)
		add(1)
	}
	e.syncNow(ctx, in)
	m, _, _ := spacestore.ReadManifest(ctx, e.cfg.Bucket, host)
	if d := dbImage(t, m).Deltas; len(d) < 3 {
		t.Fatalf("setup: the periodic checkpoints left %d deltas, want several", len(d))
	}
	db.Close()
	u.Release()
	if err := e.Sleep(ctx, host); err != nil {
		t.Fatal(err)
	}
	m, _, _ = spacestore.ReadManifest(ctx, e.cfg.Bucket, host)
	if d := dbImage(t, m).Deltas; len(d) > 1 {
		t.Fatalf("after the sleep the next wake reads %d deltas, want at most 1", len(d))
	}
}

// TestPeriodicCheckpointsKeepTheChainShort: after each periodic checkpoint the engine folds
// a chain longer than spacestore.FoldChain, so a wake after a crash (no sleep checkpoint) reads
// at most that many deltas, however long the space ran.
func TestPeriodicCheckpointsKeepTheChainShort(t *testing.T) {
	e := newAwakeTestEngine(t, 0)
	ctx := context.Background()
	const host = "crash.example.com"
	u, err := e.Acquire(ctx, Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Release()
	in := e.get(host)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(in.dataDir, "app.db")+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE m (id INTEGER PRIMARY KEY, body BLOB)"); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 1000)
	add := func(n int) {
		tx, _ := db.Begin()
		for range n {
			rand.Read(body)
			if _, err := tx.Exec("INSERT INTO m (body) VALUES (?)", body); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	add(6000)
	longest := 0
	for range 3 * spacestore.FoldChain {
		e.syncNow(ctx, in)
		m, _, _ := spacestore.ReadManifest(ctx, e.cfg.Bucket, host)
		longest = max(longest, len(dbImage(t, m).Deltas))
		add(1)
	}
	if longest > spacestore.FoldChain {
		t.Fatalf("a wake after a crash would have read %d deltas, want at most %d", longest, spacestore.FoldChain)
	}
}

func dbImage(t *testing.T, m *spacestore.Manifest) *spacestore.DBImage {
	t.Helper()
	if m != nil {
		for _, f := range m.Files {
			if f.Path == "app.db" && f.Content != nil && f.Content.DB != nil {
				return f.Content.DB
			}
		}
	}
	t.Fatalf("no app.db page image in %+v", m)
	return nil
}
