package engine

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/spacestore/pageread/pagereadtest"
)

// TestCraftedDatabaseFailsOnlyItsSpace: an isolated space's checkpoints read its databases
// in lchat-pageread under the space's uid. A database the space cannot read (here root's,
// 0600) fails that checkpoint though the box is root, and a WAL that is a FIFO (which used
// to stall the box's read for good) fails it at once; each failure is logged naming the file,
// the space stays unsaved, and another space on the box sleeps and wakes as before.
func TestCraftedDatabaseFailsOnlyItsSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	dir, inst := reachableInstance(t, "iso")
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	e, err := New(Config{Bucket: b, StateDir: filepath.Join(dir, "state"), Holder: "box", Incarnation: "1",
		Kinds: map[string]Kind{"app": {Command: inst, Env: map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
			Replication: Replication{Class: ReplicateSleep}, StopGrace: 5 * time.Second,
			Isolation: IsolationOn, Network: NetworkHost}},
		UIDFirst: 3200400, UIDCount: 100, PageReader: pagereadtest.Binary(t), Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	drainAtEnd(t, e)
	wake := func(host string) string {
		t.Helper()
		u, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"})
		if err != nil {
			t.Fatalf("waking %s: %v", host, err)
		}
		u.Release()
		return e.get(host).dataDir
	}
	// makeDB writes a database with rows in its WAL, owned by uid.
	makeDB := func(p string, uid int) {
		t.Helper()
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
			os.Chown(f, uid, uid)
		}
	}
	uidOf := func(p string) int {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return int(fi.Sys().(*syscall.Stat_t).Uid)
	}
	crafts := map[string]func(data string){
		"rootonly.example.com": func(data string) {
			p := filepath.Join(data, "app.db")
			makeDB(p, 0)
			os.Chmod(p, 0o600)
		},
		"fifo.example.com": func(data string) {
			p := filepath.Join(data, "app.db")
			makeDB(p, uidOf(data))
			os.Remove(p + "-wal")
			if err := syscall.Mkfifo(p+"-wal", 0o600); err != nil {
				t.Fatal(err)
			}
			os.Chown(p+"-wal", uidOf(data), uidOf(data))
		},
	}
	for host, craft := range crafts {
		craft(wake(host))
		done := make(chan error, 1)
		go func() { done <- e.Sleep(context.Background(), host) }()
		select {
		case err = <-done:
		case <-time.After(time.Minute):
			t.Fatalf("%s: the sleep's checkpoint still runs after a minute", host)
		}
		if err == nil || !strings.Contains(err.Error(), "app.db") {
			t.Fatalf("%s: sleep gave %v, want its checkpoint to fail naming app.db", host, err)
		}
		t.Logf("%s: %v", host, err)
		for _, s := range e.Status() {
			if s.Host == host && (s.State != StateUnsaved || !strings.Contains(s.LastSyncError, "app.db")) {
				t.Fatalf("%s: state %s, last sync error %q; want unsaved, naming app.db", host, s.State, s.LastSyncError)
			}
		}
		logged := false
		for _, l := range logs.FilterMessage("checkpoint").All() {
			if l.ContextMap()["host"] == host && strings.Contains(l.ContextMap()["error"].(string), "app.db") {
				logged = true
			}
		}
		if !logged {
			t.Fatalf("%s: no checkpoint error logged", host)
		}
	}
	// Another space with a database of its own: unaffected.
	const other = "other.example.com"
	data := wake(other)
	makeDB(filepath.Join(data, "app.db"), uidOf(data))
	if err := e.Sleep(context.Background(), other); err != nil {
		t.Fatalf("the other space's sleep: %v", err)
	}
	wake(other)
	if _, err := os.Stat(filepath.Join(e.get(other).dataDir, "app.db")); err != nil {
		t.Fatalf("the other space's database after a sleep and a wake: %v", err)
	}
}

// TestPeriodicCheckpointReadsDatabasesOfAFrozenInstance: a periodic checkpoint of a running
// isolated instance freezes its cgroup and reads its databases with lchat-pageread, which
// is outside that cgroup: the checkpoint completes (a helper inside the frozen group would
// stop with it until its deadline) and the database is in the manifest.
func TestPeriodicCheckpointReadsDatabasesOfAFrozenInstance(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	dir, inst := reachableInstance(t, "iso")
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Bucket: b, StateDir: filepath.Join(dir, "state"), Holder: "box", Incarnation: "1",
		Kinds: map[string]Kind{"app": {Command: inst, Env: map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
			Replication: Replication{Class: ReplicatePeriodic, Interval: 100 * time.Millisecond}, StopGrace: 5 * time.Second,
			Isolation: IsolationOn, Network: NetworkHost}},
		UIDFirst: 3200500, UIDCount: 100, PageReader: pagereadtest.Binary(t), PageReadTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	drainAtEnd(t, e)
	const host = "frozen-db.example.com"
	u, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Release()
	data := e.get(host).dataDir
	fi, _ := os.Stat(data)
	uid := int(fi.Sys().(*syscall.Stat_t).Uid)
	p := filepath.Join(data, "app.db")
	db, err := sql.Open("sqlite", "file:"+p+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	for _, q := range []string{"CREATE TABLE t (x)", "INSERT INTO t VALUES (randomblob(5000))"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	for _, f := range []string{p, p + "-wal", p + "-shm"} {
		os.Chown(f, uid, uid)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var st SpaceStatus
		for _, s := range e.Status() {
			if s.Host == host {
				st = s
			}
		}
		if st.LastSyncError != "" {
			t.Fatalf("periodic checkpoint: %s", st.LastSyncError)
		}
		e.get(host).op.Lock()
		m, _ := e.get(host).syncer.Manifest()
		e.get(host).op.Unlock()
		if m != nil && slices.ContainsFunc(m.Files, func(f spacestore.File) bool { return f.Path == "app.db" && f.Content != nil && f.Content.DB != nil }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no periodic checkpoint took the database in a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
