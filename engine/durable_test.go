package engine

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

// TestDurableStatusCountsTheLog: a space of the default durability (bucket) ships what its
// instance commits: after WaitDurable the status shows the segments landed and nothing
// unproven; a checkpoint then folds them (a new generation, its log from seq 1).
func TestDurableStatusCountsTheLog(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real instance")
	}
	ctx := context.Background()
	fb, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := reuseTestEngine(t, fb, "box-a")
	const host = "durable.example.com"
	u, err := e.Acquire(ctx, Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Release()
	if u.Gate() == nil {
		t.Fatal("a kind with no durability set has no gate: bucket is the default")
	}
	in := e.get(host)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(in.dataDir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	for _, q := range []string{"CREATE TABLE m (id INTEGER PRIMARY KEY, body TEXT)", "INSERT INTO m (body) VALUES ('one')", "INSERT INTO m (body) VALUES ('two')"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
		if err := u.WaitDurable(ctx); err != nil {
			t.Fatalf("WaitDurable after %q: %v", q, err)
		}
	}
	st := logStatusOf(t, e, host)
	if st.Segments < 3 || st.Unproven != 0 || st.Landing != 0 || st.Folded != 0 {
		t.Fatalf("after three commits, each waited for: %+v", st)
	}
	if !u.LogCarriesAll() {
		t.Fatal("a data dir of one database in WAL mode: the log does not carry it all")
	}
	// A plain file is durable at checkpoints only: acknowledgements are no longer durable
	// at the gate.
	if err := os.WriteFile(filepath.Join(in.dataDir, "notes.txt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := u.WaitDurable(ctx); err != nil {
		t.Fatal(err)
	}
	if u.LogCarriesAll() {
		t.Fatalf("the log carries all beside a plain file (skipped %v)", logStatusOf(t, e, host).Skipped)
	}
	if err := os.Remove(filepath.Join(in.dataDir, "notes.txt")); err != nil {
		t.Fatal(err)
	}
	st = logStatusOf(t, e, host)
	landed := st.Segments

	e.syncNow(ctx, in)
	st = logStatusOf(t, e, host)
	if st.Folded != landed || st.NextSeq != 1 || st.Generation == 0 {
		t.Fatalf("after a checkpoint: %+v, want the %d segments folded and the log restarted", st, landed)
	}
}

func logStatusOf(t *testing.T, e *Engine, host string) DurableStatus {
	t.Helper()
	for _, s := range e.Status() {
		if s.Host == host && s.Log != nil {
			return *s.Log
		}
	}
	t.Fatalf("no log in the status of %s", host)
	return DurableStatus{}
}
