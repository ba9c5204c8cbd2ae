package spacestore

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/spacestore/pageread"
)

// viewOf is everything a view gives: its shape and every page.
type viewOf struct {
	shape pageread.Shape
	pages []string
}

func readView(t *testing.T, v pageread.Source, err error) viewOf {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := v.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	got := viewOf{shape: v.Shape()}
	if err := v.IndexAll(); err != nil {
		t.Fatal(err)
	}
	if err := v.Scan(func(_ uint32, data []byte) error { got.pages = append(got.pages, string(data)); return nil }); err != nil {
		t.Fatal(err)
	}
	got.shape.Tail = false
	return got
}

func sameView(t *testing.T, what string, got, want viewOf) {
	t.Helper()
	if got.shape != want.shape || len(got.pages) != len(want.pages) {
		t.Fatalf("%s: %+v (%d pages), want %+v (%d pages)", what, got.shape, len(got.pages), want.shape, len(want.pages))
	}
	for i := range want.pages {
		if got.pages[i] != want.pages[i] {
			t.Fatalf("%s: page %d differs", what, i+1)
		}
	}
}

// waitExited returns once the process pid has exited, leaving it for its parent to reap.
func waitExited(t *testing.T, pid int) {
	t.Helper()
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
}

// TestHelperViewsKeepOneHelper: one lchat-pageread serves many views of a database written
// between them, each the same as a view in this process; a killed helper, and one that
// failed on a file that is not a database, is replaced at the next open; forgetting the
// last database ends the helper, which closes its connection: the instance may then leave
// WAL mode.
func TestHelperViewsKeepOneHelper(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	var mu sync.Mutex
	var pids []int
	s := spaceDir(t, membucket.New(), testSpaceUID, func(pid int) { mu.Lock(); pids = append(pids, pid); mu.Unlock() })
	started := func() []int { mu.Lock(); defer mu.Unlock(); return append([]int(nil), pids...) }
	p := filepath.Join(s.DataDir, "app.db")
	db := openDB(t, p)
	fillDB(t, db, 5, 100)
	handTo(t, s.DataDir, testSpaceUID)
	k := NewHelperViews(s.PageReader)
	defer k.Close()
	inProcess := func(since *pageread.WALPos) viewOf {
		v, err := pageread.Open(ctx, p, since)
		return readView(t, v, err)
	}
	var since *pageread.WALPos
	for i := range 30 {
		fillDB(t, db, 1+i%4, 300)
		if i == 12 {
			db.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
		}
		handTo(t, s.DataDir, testSpaceUID)
		want := inProcess(since)
		v, err := k.Open(ctx, p, since)
		got := readView(t, v, err)
		sameView(t, "view "+string(rune('A'+i)), got, want)
		pos := want.shape.Pos
		since = &pos
	}
	if n := len(started()); n != 1 {
		t.Fatalf("%d helpers started for 30 views, want 1", n)
	}

	syscall.Kill(started()[0], syscall.SIGKILL)
	waitExited(t, started()[0])
	fillDB(t, db, 2, 300)
	want := inProcess(nil)
	v, err := k.Open(ctx, p, nil)
	sameView(t, "after the helper was killed", readView(t, v, err), want)
	if n := len(started()); n != 2 {
		t.Fatalf("%d helpers started, want a second after the kill", n)
	}

	junk := filepath.Join(s.DataDir, "junk.db")
	os.WriteFile(junk, append([]byte("SQLite format 3\x00\x00\x03"), make([]byte, 4096)...), 0o600)
	handTo(t, s.DataDir, testSpaceUID)
	if v, err := k.Open(ctx, junk, nil); err == nil {
		v.Close()
		t.Fatal("a view of a file with page size 3")
	}
	v, err = k.Open(ctx, p, nil)
	sameView(t, "after the helper failed", readView(t, v, err), want)
	if n := len(started()); n != 3 {
		t.Fatalf("%d helpers started, want a third after the one that failed", n)
	}

	k.Forget(p)
	if k.h != nil {
		t.Fatal("the helper outlives its last database")
	}
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode=DELETE").Scan(&mode); err != nil || mode != "delete" {
		t.Fatalf("leaving WAL mode once forgotten = %q, %v", mode, err)
	}
}

// TestLogShipperViewsAgree: the segments a shipper cuts are the same byte for byte
// whether its views keep their connection or open their own, in this process or through
// lchat-pageread, across commits, a WAL truncated, a pause longer than keepIdle (whose
// connections are closed, then opened again) and WAL restarts, the second of which the
// kept views (the shippers' tails) follow without the lock or a full compare.
func TestLogShipperViewsAgree(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	s := spaceDir(t, membucket.New(), testSpaceUID, nil)
	p := filepath.Join(s.DataDir, "app.db")
	db := openDB(t, p)
	fillDB(t, db, 20, 200)
	handTo(t, s.DataDir, testSpaceUID)
	claim := Claim{Holder: "https://a", Incarnation: "1", Lease: `"l"`, At: time.Unix(1e9, 0)}
	ways := map[string]*LogShipper{
		"kept":          NewLogShipper(s.DataDir, nil, nil, 1, 1, claim),
		"fresh":         NewLogShipper(s.DataDir, nil, nil, 1, 1, claim),
		"helper kept":   NewLogShipper(s.DataDir, s.PageReader, nil, 1, 1, claim),
		"helper a view": NewLogShipper(s.DataDir, s.PageReader, nil, 1, 1, claim),
	}
	for name, l := range ways {
		if name == "fresh" || name == "helper a view" {
			l.keep.Close()
			l.keep = nil
		}
		defer l.Close()
	}
	now := time.Now().Add(time.Second)
	for i := range 14 {
		switch i {
		case 0:
		case 5:
			db.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
			fillDB(t, db, 3, 200)
		case 9:
			fillDB(t, db, 300, 200) // a long WAL, for the restarts after it to write over
		case 10, 12:
			// The WAL restarts from its start, over frames longer than the new ones: at 10
			// the last cut's position is the file's end (the lock's way), at 12 a frame of
			// the earlier use of the file ends the old chain (followed).
			if _, err := db.Exec("PRAGMA wal_checkpoint(RESTART)"); err != nil {
				t.Fatal(err)
			}
			fillDB(t, db, 1, 200)
		case 8:
			// Nothing written for longer than keepIdle: the connections are let go.
			now = now.Add(2 * keepIdle)
			for name, l := range ways {
				if seg, err := l.Next(ctx, now); err != nil || seg != nil {
					t.Fatalf("%s after a pause: %v, %v", name, seg, err)
				}
			}
			if k := ways["kept"].keep.(inProcess); len(k.Kept()) != 0 {
				t.Fatalf("idle connections kept: %v", k.Kept())
			}
			if k := ways["helper kept"].keep.(*HelperViews); k.h != nil {
				t.Fatal("an idle helper kept")
			}
			fillDB(t, db, 1, 200)
		default:
			fillDB(t, db, i, 200)
		}
		handTo(t, s.DataDir, testSpaceUID)
		now = now.Add(time.Second)
		var want *Segment
		for name, l := range ways {
			scans := l.fullScans
			seg, err := l.Next(ctx, now)
			if err != nil || seg == nil {
				t.Fatalf("step %d, %s: %v, %v", i, name, seg, err)
			}
			if i == 12 && l.keep != nil && l.fullScans != scans {
				t.Fatalf("%s compared every page after one WAL restart", name)
			}
			if want == nil {
				want = seg
				continue
			}
			if len(seg.DBs) != 1 || len(want.DBs) != 1 || string(seg.DBs[0].LTX) != string(want.DBs[0].LTX) || seg.Seq != want.Seq {
				t.Fatalf("step %d: %s cut another segment", i, name)
			}
		}
	}
	if k := ways["helper kept"].keep.(*HelperViews); k.h == nil {
		t.Fatal("the isolated shipper keeps no helper")
	}
}

// TestDroppedShipperLetsGoItsConnections: a LogShipper its owner dropped without Close
// closes its kept connections once collected.
func TestDroppedShipperLetsGoItsConnections(t *testing.T) {
	dir := t.TempDir()
	fillDB(t, openDB(t, filepath.Join(dir, "app.db")), 5, 100)
	l := NewLogShipper(dir, nil, nil, 1, 1, Claim{Holder: "https://a", Incarnation: "1", Lease: `"l"`, At: time.Unix(1e9, 0)})
	if seg, err := l.Next(context.Background(), time.Now()); err != nil || seg == nil {
		t.Fatalf("Next = %v, %v", seg, err)
	}
	k := l.keep.(inProcess)
	if len(k.Kept()) != 1 {
		t.Fatalf("kept %v", k.Kept())
	}
	l = nil
	for i := 0; len(k.Kept()) != 0; i++ {
		if i == 10000 {
			t.Fatalf("kept %v after the shipper was collected", k.Kept())
		}
		runtime.GC()
		runtime.Gosched()
	}
}

// TestKeptHelperFollowsTheInstancesLastClose: when every connection of the instance closes
// between two views (an app that opens its database per request), SQLite's last close
// may checkpoint and delete the WAL and -shm files, and the instance's next connection makes
// new ones. The next view must lock the new ones: the instance's write (busy timeout 0)
// meets its lock, and it reads what a view in this process reads. The kept connection's
// close, while the instance has its database open, leaves the instance's WAL alone.
func TestKeptHelperFollowsTheInstancesLastClose(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	s := spaceDir(t, membucket.New(), testSpaceUID, nil)
	p := filepath.Join(s.DataDir, "app.db")
	instance := func() *sql.DB {
		db, err := sql.Open("sqlite", "file:"+p+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(0)")
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		t.Cleanup(func() { db.Close() })
		return db
	}
	db := instance()
	fillDB(t, db, 5, 100)
	handTo(t, s.DataDir, testSpaceUID)
	k := NewHelperViews(s.PageReader)
	defer k.Close()
	for i := range 3 {
		v, err := k.Open(ctx, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec("INSERT INTO messages (room, created_at, body) VALUES (1, 2, 'x')"); err == nil {
			t.Fatalf("round %d: the instance wrote while a view was open: the view's lock is not the instance's", i)
		}
		got := readView(t, v, nil)
		want := func() viewOf { v, err := pageread.Open(ctx, p, nil); return readView(t, v, err) }()
		sameView(t, "round", got, want)
		// Every connection of the instance closes, and it opens a new one.
		db.Close()
		db = instance()
		fillDB(t, db, 1, 100)
		handTo(t, s.DataDir, testSpaceUID)
	}
	// The kept connection closes while the instance has commits in its WAL.
	var n int
	db.QueryRow("SELECT count(*) FROM messages").Scan(&n)
	walBefore, err := os.ReadFile(p + "-wal")
	if err != nil || len(walBefore) == 0 {
		t.Fatalf("no WAL to keep (%v)", err)
	}
	k.Close()
	if _, err := os.Lstat(p + "-wal"); err != nil {
		t.Fatalf("the kept connection's close removed the instance's WAL: %v", err)
	}
	db.Close()
	if got := rows(t, p); got != n {
		t.Fatalf("%d rows after the kept connection closed, want %d", got, n)
	}
}
