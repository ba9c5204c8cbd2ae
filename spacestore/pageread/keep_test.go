package pageread

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The instance's side in these tests: a connection of its own to the database, as the
// space's app has. busy_timeout 0 (SQLite's default) makes a write that meets a lock fail at
// once instead of waiting, so a lock held where none should be shows as an error.
func instanceDB(t *testing.T, p string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+p+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(0)&_pragma=wal_autocheckpoint(0)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	exec(t, db, "CREATE TABLE IF NOT EXISTS m (id INTEGER PRIMARY KEY, body BLOB)")
	return db
}

func exec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func insert(t *testing.T, db *sql.DB, n int, tag string) {
	t.Helper()
	for i := range n {
		exec(t, db, "INSERT INTO m (body) VALUES (?)", bytes.Repeat([]byte(tag), 300+i))
	}
}

// snapshot is everything a view gives: its shape, the changed pages of a tail view, and
// every page.
type snapshot struct {
	shape   Shape
	changed []uint32
	pages   map[uint32]string
}

func take(t *testing.T, open func(since *WALPos) (Source, error), since *WALPos) snapshot {
	t.Helper()
	v, err := open(since)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	var s snapshot
	s.shape = v.Shape()
	if s.shape.Tail {
		if s.changed, err = v.ChangedSinceTail(); err != nil {
			t.Fatal(err)
		}
		if err := v.IndexAll(); err != nil {
			t.Fatal(err)
		}
	}
	s.pages = make(map[uint32]string)
	if err := v.Scan(func(pg uint32, data []byte) error { s.pages[pg] = string(data); return nil }); err != nil {
		t.Fatal(err)
	}
	return s
}

func sameSnapshot(t *testing.T, what string, got, want snapshot) {
	t.Helper()
	if got.shape != want.shape || fmt.Sprint(got.changed) != fmt.Sprint(want.changed) || len(got.pages) != len(want.pages) {
		t.Fatalf("%s: shape %+v changed %v (%d pages), want %+v changed %v (%d pages)", what,
			got.shape, got.changed, len(got.pages), want.shape, want.changed, len(want.pages))
	}
	for pg, data := range want.pages {
		if got.pages[pg] != data {
			t.Fatalf("%s: page %d differs", what, pg)
		}
	}
}

// TestKeptViewsReadWhatFreshViewsRead: views on a kept connection give the same shape,
// changed pages and page images as views on a connection of their own, across commits,
// a checkpoint of the WAL into the database and a WAL restart, and they reuse the one
// connection.
func TestKeptViewsReadWhatFreshViewsRead(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "app.db")
	db := instanceDB(t, p)
	k := NewKeeper()
	defer k.Close()
	fresh := func(since *WALPos) (Source, error) { return Open(ctx, p, since) }
	kept := func(since *WALPos) (Source, error) { return k.Open(ctx, p, since) }
	var since *WALPos
	var first *conn
	steps := []func(){
		func() { insert(t, db, 20, "a") },
		func() { insert(t, db, 3, "b") },
		func() {}, // nothing new
		func() { exec(t, db, "PRAGMA wal_checkpoint(PASSIVE)"); insert(t, db, 2, "c") },
		func() { exec(t, db, "PRAGMA wal_checkpoint(TRUNCATE)"); insert(t, db, 5, "d") }, // the WAL restarts
		func() { exec(t, db, "DELETE FROM m WHERE id % 2 = 0") },
	}
	for i, step := range steps {
		step()
		want := take(t, fresh, since)
		got := take(t, kept, since)
		sameSnapshot(t, fmt.Sprintf("step %d", i), got, want)
		if c := k.conns[p]; c == nil || first != nil && c != first {
			t.Fatalf("step %d: the kept connection is %p, was %p", i, c, first)
		} else {
			first = c
		}
		pos := want.shape.Pos
		since = &pos
	}
}

// TestKeptConnectionFollowsAReplacedFile: a database renamed over the kept connection's
// file is read as the new file, under the new file's lock: the instance's write to the new
// file meets the view's lock, which a lock left on the old file would not hold.
func TestKeptConnectionFollowsAReplacedFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := filepath.Join(dir, "app.db")
	old := instanceDB(t, p)
	insert(t, old, 10, "o")
	k := NewKeeper()
	defer k.Close()
	take(t, func(since *WALPos) (Source, error) { return k.Open(ctx, p, since) }, nil)
	oldConn := k.conns[p]

	// The instance restores another database over it, as from a backup of its own: its
	// connections closed, the old file moved aside, SQLite's side files removed, the new
	// file renamed into place.
	old.Close()
	if err := os.Rename(p, filepath.Join(dir, "was.db")); err != nil {
		t.Fatal(err)
	}
	np := filepath.Join(dir, "new.db")
	ndb := instanceDB(t, np)
	insert(t, ndb, 40, "n")
	exec(t, ndb, "PRAGMA wal_checkpoint(TRUNCATE)")
	ndb.Close()
	os.Remove(p + "-wal")
	os.Remove(p + "-shm")
	os.Remove(np + "-wal")
	os.Remove(np + "-shm")
	if err := os.Rename(np, p); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Lstat(p)
	want := take(t, func(since *WALPos) (Source, error) { return Open(ctx, p, since) }, nil)

	v, err := k.Open(ctx, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	sh := v.Shape()
	if st := fi.Sys().(*syscall.Stat_t); sh.Ino != st.Ino {
		t.Fatalf("view of inode %d, the file at the path is %d", sh.Ino, st.Ino)
	}
	inst := instanceDB(t, p)
	if _, err := inst.Exec("INSERT INTO m (body) VALUES ('x')"); !busy(err) {
		t.Fatalf("the instance wrote to the new file while a view of it was open (%v): the view's lock is not on it", err)
	}
	if k.conns[p] == oldConn {
		t.Fatal("the connection to the replaced file is still kept")
	}
	got := snapshot{shape: sh, pages: make(map[uint32]string)}
	v.Scan(func(pg uint32, data []byte) error { got.pages[pg] = string(data); return nil })
	v.Close()
	sameSnapshot(t, "the replaced file", got, want)
	exec(t, inst, "INSERT INTO m (body) VALUES ('x')")
}

// TestKeptConnectionNeverBlocksTheInstance: between two views the kept connection holds no
// transaction: the instance's writes (with SQLite's default busy timeout of 0) and a
// checkpoint that truncates the WAL go through; during a view they meet its lock. Once the
// keeper forgets the database, the instance may leave WAL mode.
func TestKeptConnectionNeverBlocksTheInstance(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "app.db")
	db := instanceDB(t, p)
	insert(t, db, 5, "a")
	k := NewKeeper()
	defer k.Close()
	for i := range 3 {
		v, err := k.Open(ctx, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec("INSERT INTO m (body) VALUES ('during')"); !busy(err) {
			t.Fatalf("view %d: a write during the view = %v, want SQLITE_BUSY", i, err)
		}
		v.Close()
		insert(t, db, 1, "between") // fails the test on SQLITE_BUSY
		var busyCk, logFrames, ckFrames int
		if err := db.QueryRow("PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busyCk, &logFrames, &ckFrames); err != nil || busyCk != 0 {
			t.Fatalf("view %d: a truncating checkpoint between views = busy %d, %v", i, busyCk, err)
		}
	}
	if len(k.Kept()) != 1 {
		t.Fatalf("kept %v", k.Kept())
	}
	k.Forget(p)
	if len(k.Kept()) != 0 {
		t.Fatalf("kept %v after Forget", k.Kept())
	}
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode=DELETE").Scan(&mode); err != nil || mode != "delete" {
		t.Fatalf("leaving WAL mode once forgotten = %q, %v", mode, err)
	}
}

// TestKeeperLendsOneViewAtATime: a second view of a database while the first holds its
// kept connection gets one of its own, closed at its end, and the next view the kept one;
// views after Close still work and keep nothing.
func TestKeeperLendsOneViewAtATime(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := filepath.Join(dir, "app.db")
	db := instanceDB(t, p)
	insert(t, db, 5, "a")
	k := NewKeeper()
	v1, err := k.Open(ctx, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A second view now would wait for the first's lock: what it is lent is checked here.
	kept := k.conns[p]
	c, reused, err := k.take(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if reused || c == kept {
		t.Fatal("a second view got the kept connection while the first holds it")
	}
	k.put(c, true)
	v1.Close()
	if k.conns[p] != kept || len(k.Kept()) != 1 {
		t.Fatalf("kept %v", k.Kept())
	}
	if v, err := k.Open(ctx, p, nil); err != nil || v.conn != kept {
		t.Fatalf("the next view got %v, %v; want the kept connection", v, err)
	} else {
		v.Close()
	}
	k.Close()
	k.Close()
	if v, err := k.Open(ctx, p, nil); err != nil {
		t.Fatal(err)
	} else {
		v.Close()
	}
	if len(k.Kept()) != 0 {
		t.Fatalf("kept %v after Close", k.Kept())
	}
}

// pipeHelper runs Serve as lchat-pageread would, on pipes: the box's ends are returned.
func pipeHelper(t *testing.T) (fromHelper io.Reader, toHelper io.WriteCloser, served chan error) {
	t.Helper()
	// OS pipes, as the helper has: their buffers let the box send the open behind the hello.
	reqR, reqW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ansR, ansW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	served = make(chan error, 1)
	go func() {
		err := Serve(context.Background(), reqR, ansW)
		ansW.Close()
		reqR.Close()
		served <- err
	}()
	t.Cleanup(func() { reqW.Close(); ansR.Close() })
	return ansR, reqW, served
}

// TestSessionServesViewsInTurn: one helper serves many views of two databases, each the
// same as an in-process view; Forget closes one's connection; the helper ends cleanly when
// the box closes its stdin.
func TestSessionServesViewsInTurn(t *testing.T) {
	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "a.db"), filepath.Join(dir, "b.db")}
	dbs := []*sql.DB{instanceDB(t, paths[0]), instanceDB(t, paths[1])}
	r, w, served := pipeHelper(t)
	s := NewSession(r, w)
	since := make([]*WALPos, 2)
	for i := range 20 {
		for d, p := range paths {
			insert(t, dbs[d], 1+i%3, "x")
			files := boxFiles(t, p)
			want := take(t, func(since *WALPos) (Source, error) { return Open(context.Background(), p, since) }, since[d])
			got := take(t, func(since *WALPos) (Source, error) { return s.Open(p, since, files) }, since[d])
			sameSnapshot(t, fmt.Sprintf("view %d of %s", i, filepath.Base(p)), got, want)
			pos := want.shape.Pos
			since[d] = &pos
		}
	}
	if err := s.Forget(paths[0]); err != nil {
		t.Fatal(err)
	}
	var mode string
	if err := dbs[0].QueryRow("PRAGMA journal_mode=DELETE").Scan(&mode); err != nil || mode != "delete" {
		t.Fatalf("leaving WAL mode once forgotten = %q, %v", mode, err)
	}
	w.Close()
	if err := <-served; err != nil {
		t.Fatalf("the helper ended with %v", err)
	}
	if s.Err() != nil {
		t.Fatal(s.Err())
	}
}

func boxFiles(t *testing.T, p string) Files {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	f := Files{Dev: uint64(st.Dev), Ino: st.Ino, MainSize: fi.Size()}
	if wi, err := os.Lstat(p + "-wal"); err == nil {
		f.WALSize = wi.Size()
	}
	return f
}

// TestOldBoxAndOldHelper: a box of version 1 (an open first, no hello) is still served;
// a helper of version 1 (which answers a hello with an error) is named as older than the
// box.
func TestOldBoxAndOldHelper(t *testing.T) {
	p := filepath.Join(t.TempDir(), "app.db")
	insert(t, instanceDB(t, p), 3, "a")
	r, w, served := pipeHelper(t)
	req := make([]byte, 1+walPosLen)
	if err := writeRequest(w, opOpen, append(req, p...)); err != nil {
		t.Fatal(err)
	}
	kind, _, err := NewSession(r, w).readFrame(0)
	if err != nil || kind != frameShape {
		t.Fatalf("a version 1 open got frame %q, %v", kind, err)
	}
	w.Close()
	if err := <-served; err != nil {
		t.Fatalf("the helper ended with %v", err)
	}

	old := new(stream).frame(frameError, []byte("first request is 'V', not open"))
	_, err = NewSession(bytes.NewReader(old.Bytes()), io.Discard).Open(p, nil, goodFiles)
	if err == nil || !strings.Contains(err.Error(), "older lchat-pageread") {
		t.Fatalf("an old helper gave %v", err)
	}
}

// TestViewWaitsForTheInstancesWriteLock: a view opened while the instance holds the write
// lock waits for it (begin's own wait: the connection's busy timeout is 0) and opens once
// the instance's transaction ends, with its commit in the view; a view whose ctx ends first
// fails with the ctx's error and leaves the keeper usable.
func TestViewWaitsForTheInstancesWriteLock(t *testing.T) {
	p := filepath.Join(t.TempDir(), "app.db")
	db := instanceDB(t, p)
	insert(t, db, 3, "before")
	k := NewKeeper()
	defer k.Close()
	v, err := k.Open(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := v.Shape().Pos.Frames
	v.Close() // the keeper keeps the connection: the next views begin on it

	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("INSERT INTO m (body) VALUES ('held')"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = k.Open(ctx, p, nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a view while the instance writes, ctx ending: %v, want the ctx's deadline", err)
	}

	opened := make(chan *View, 1)
	go func() {
		v, err := k.Open(context.Background(), p, nil)
		if err != nil {
			t.Error(err)
		}
		opened <- v
	}()
	select {
	case v := <-opened:
		t.Fatalf("a view opened while the instance held the write lock: %v", v)
	case <-time.After(30 * time.Millisecond):
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	v = <-opened
	if v == nil {
		t.FailNow()
	}
	defer v.Close()
	if got := v.Shape().Pos.Frames; got <= before {
		t.Fatalf("the view after the commit reads %d frames, as before it (%d)", got, before)
	}
}

// TestWALChecksumBothByteOrders: the checksum of SQLite's WAL (wal.c, walChecksumBytes) in
// either byte order, against the formula read with an explicit ByteOrder, over random data
// of lengths on either side of walChecksum's 32-byte steps (a frame header, a page, a
// header and a page), from random sums.
func TestWALChecksumBothByteOrders(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 4, 8, 16, 24, 32, 40, 56, 64, 72, 100, 512, 4096, 4096 + 24, 65536 + 8} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
			s1, s2 := rng.Uint32(), rng.Uint32()
			w1, w2 := refWALChecksum(order, b, s1, s2)
			if g1, g2 := walChecksum(order == binary.BigEndian, b, s1, s2); g1 != w1 || g2 != w2 {
				t.Errorf("%v, %d bytes: walChecksum = %#x %#x, want %#x %#x", order, n, g1, g2, w1, w2)
			}
		}
	}
}

// refWALChecksum is SQLite's WAL checksum as wal.c writes it, a word pair at a time.
func refWALChecksum(order binary.ByteOrder, b []byte, s1, s2 uint32) (uint32, uint32) {
	for i := 0; i+8 <= len(b); i += 8 {
		s1 += order.Uint32(b[i:]) + s2
		s2 += order.Uint32(b[i+4:]) + s1
	}
	return s1, s2
}

// BenchmarkWALChecksum is the checksum of one frame's 4 KiB page in either byte order
// (SQLite writes its machine's: little-endian on amd64 and arm64), side by side with the
// loops it replaced (plainWALChecksum):
//
//	go test ./spacestore/pageread -run '^$' -bench WALChecksum -count 5
func BenchmarkWALChecksum(b *testing.B) {
	page := make([]byte, 4096)
	for i := range page {
		page[i] = byte(i*131 + i>>8)
	}
	for _, order := range []string{"little-endian", "big-endian"} {
		be := order == "big-endian"
		for _, f := range []struct {
			name string
			sum  func(bool, []byte, uint32, uint32) (uint32, uint32)
		}{{"plain", plainWALChecksum}, {"walChecksum", walChecksum}} {
			b.Run(order+"/"+f.name, func(b *testing.B) {
				b.SetBytes(int64(len(page)))
				var s1, s2 uint32
				for b.Loop() {
					s1, s2 = f.sum(be, page, s1, s2)
				}
			})
		}
	}
}

// plainWALChecksum is walChecksum before it took four steps at once.
func plainWALChecksum(bigEndian bool, b []byte, s1, s2 uint32) (uint32, uint32) {
	if bigEndian {
		for ; len(b) >= 8; b = b[8:] {
			s1 += binary.BigEndian.Uint32(b) + s2
			s2 += binary.BigEndian.Uint32(b[4:]) + s1
		}
		return s1, s2
	}
	for ; len(b) >= 8; b = b[8:] {
		s1 += binary.LittleEndian.Uint32(b) + s2
		s2 += binary.LittleEndian.Uint32(b[4:]) + s1
	}
	return s1, s2
}
