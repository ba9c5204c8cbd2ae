package engine

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
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
	const host = "durable.example.com"
	e, u, in, db := awakeWithDatabase(t, host)
	defer u.Release()
	defer db.Close()
	if u.Gate() == nil {
		t.Fatal("a kind with no durability set has no gate: bucket is the default")
	}
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

// awakeWithDatabase wakes host, of the default durability, on an engine of its own with a
// file bucket, and opens app.db in its data dir as its instance would (WAL, busy_timeout):
// the test writes through it what the instance commits.
func awakeWithDatabase(t *testing.T, host string) (*Engine, *Use, *inst, *sql.DB) {
	t.Helper()
	fb, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := reuseTestEngine(t, fb, "box-a")
	u, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	in := e.get(host)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(in.dataDir, "app.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		u.Release()
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	return e, u, in, db
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

// TestSleepLetsGoOfTheDatabases: the log's cuts keep a connection to each database
// between segments; the space's sleep closes them, so the box holds no file of a sleeping
// space open (its final checkpoint, and a later wake elsewhere, see the files as the
// instance left them).
func TestSleepLetsGoOfTheDatabases(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real instance")
	}
	ctx := context.Background()
	const host = "letgo.example.com"
	e, u, in, db := awakeWithDatabase(t, host)
	for _, q := range []string{"CREATE TABLE m (id INTEGER PRIMARY KEY)", "INSERT INTO m DEFAULT VALUES"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close() // the instance's own connection: what stays open is the box's
	if err := u.WaitDurable(ctx); err != nil {
		t.Fatal(err)
	}
	if open := filesOpenUnder(t, in.dataDir); len(open) == 0 {
		// A kept connection idle for 5 s is closed: a stalled machine can get there first.
		t.Skip("no connection kept between cuts (closed idle already?): the test proves nothing")
	}
	u.Release()
	if err := e.Sleep(ctx, host); err != nil {
		t.Fatal(err)
	}
	if open := filesOpenUnder(t, in.dataDir); len(open) > 0 {
		t.Fatalf("asleep, the box still holds %v open", open)
	}
}

// filesOpenUnder lists the files under dir this process holds open.
func filesOpenUnder(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	var out []string
	for _, e := range ents {
		p, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	return out
}
