package isolation

import (
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestCraftedDatabaseFailsOnlyItsCheckpoint: a real box reads its isolated spaces'
// databases with the lchat-pageread beside its executable, under each space's uid. A
// database the space's uid cannot read (root's, though the box is root) and a WAL that is a
// FIFO each fail only their own space's sleep checkpoint, logged naming the file; a third
// space's database sleeps, and the box keeps serving it.
func TestCraftedDatabaseFailsOnlyItsCheckpoint(t *testing.T) {
	needRoot(t)
	b := startIsoBox(t)
	hosts := []string{"dbroot.localhost", "dbfifo.localhost", "dbgood.localhost"}
	for _, h := range hosts {
		b.mustAdmin("POST", "/lchat/routes", map[string]any{"host": h, "kind": "escape", "hibernate": true}, nil)
		wake(t, b, h)
	}
	dataDir := func(host string) string { return filepath.Join(b.dir, "state", "spaces", "spaces", host, "data") }
	makeDB := func(host string, owner int) string {
		p := filepath.Join(dataDir(host), "app.db")
		db, err := sql.Open("sqlite", "file:"+p+"?_pragma=journal_mode(WAL)")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		db.SetMaxOpenConns(1)
		for _, q := range []string{"PRAGMA wal_autocheckpoint=0", "CREATE TABLE t (x)", "INSERT INTO t VALUES (randomblob(5000))"} {
			if _, err := db.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
		for _, f := range []string{p, p + "-wal", p + "-shm"} {
			os.Chown(f, owner, owner)
		}
		return p
	}
	owner := func(host string) int {
		fi, err := os.Stat(dataDir(host))
		if err != nil {
			t.Fatal(err)
		}
		return int(fi.Sys().(*syscall.Stat_t).Uid)
	}
	os.Chmod(makeDB("dbroot.localhost", 0), 0o600)
	p := makeDB("dbfifo.localhost", owner("dbfifo.localhost"))
	os.Remove(p + "-wal")
	if err := syscall.Mkfifo(p+"-wal", 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chown(p+"-wal", owner("dbfifo.localhost"), owner("dbfifo.localhost"))
	makeDB("dbgood.localhost", owner("dbgood.localhost"))

	// The kind sleeps its spaces after 2 s idle.
	var st map[string]syncStatus
	harness.WaitFor(t, time.Minute, "the three spaces to stop", func() bool {
		st = syncStatuses(b)
		for _, h := range hosts {
			if s := st[h].State; s == "awake" || s == "sleeping" || s == "" {
				return false
			}
		}
		return true
	})
	for _, h := range hosts[:2] {
		if st[h].State != "unsaved" || !strings.Contains(st[h].LastSyncError, "app.db") {
			t.Errorf("%s: %s, last sync error %q; want unsaved, naming app.db", h, st[h].State, st[h].LastSyncError)
		}
		t.Logf("%s: %s", h, st[h].LastSyncError)
	}
	if !strings.Contains(st["dbroot.localhost"].LastSyncError, "page reader") {
		t.Errorf("the root-only database was not read by the page reader: %q", st["dbroot.localhost"].LastSyncError)
	}
	if st["dbgood.localhost"].State != "asleep" {
		t.Errorf("the sane space is %s after its sleep (%q)", st["dbgood.localhost"].State, st["dbgood.localhost"].LastSyncError)
	}
	if logs := b.logs.String(); !strings.Contains(logs, `"msg":"checkpoint"`) || !strings.Contains(logs, "app.db") {
		t.Error("no checkpoint error in the box's log")
	}
	wake(t, b, "dbgood.localhost")
	if _, err := os.Stat(filepath.Join(dataDir("dbgood.localhost"), "app.db")); err != nil {
		t.Fatalf("the sane space's database after its wake: %v", err)
	}
}

type syncStatus struct {
	State         string `json:"state"`
	LastSyncError string `json:"last_sync_error"`
}

func syncStatuses(b *box) map[string]syncStatus {
	var st struct {
		Spaces []struct {
			Host string `json:"host"`
			syncStatus
		} `json:"spaces"`
	}
	b.mustAdmin("GET", "/lchat/status", nil, &st)
	out := make(map[string]syncStatus)
	for _, s := range st.Spaces {
		out[s.Host] = s.syncStatus
	}
	return out
}
