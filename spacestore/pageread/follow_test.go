package pageread

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// posNow is how far the database's WAL is committed now, as a locked view finds it.
func posNow(t *testing.T, p string) WALPos {
	t.Helper()
	v, err := openLocked(context.Background(), nil, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	return v.Shape().Pos
}

// tailOf is what a tail view gives: its shape, its changed pages and their data.
func tailOf(t *testing.T, v *View) (Shape, []uint32, map[uint32]string) {
	t.Helper()
	changed, err := v.ChangedSinceTail()
	if err != nil {
		t.Fatal(err)
	}
	data := make(map[uint32]string)
	if err := v.ReadPages(changed, func(pg uint32, b []byte) error { data[pg] = string(b); return nil }); err != nil {
		t.Fatal(err)
	}
	return v.Shape(), changed, data
}

// TestUnlockedTailReadsWhatTheLockedReads: across commits, nothing new, a checkpoint into
// the main file, deletes and a WAL restart, the tail read without the lock gives the shape,
// changed pages and page data the same tail read under the lock gives, and it declines
// (the caller takes the lock) once the WAL restarted since the WALPos.
func TestUnlockedTailReadsWhatTheLockedReads(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "app.db")
	db := instanceDB(t, p)
	insert(t, db, 5, "0")
	pos := posNow(t, p)
	steps := []struct {
		name     string
		step     func()
		restarts bool
	}{
		{"commits", func() { insert(t, db, 20, "a") }, false},
		{"one commit", func() { insert(t, db, 1, "b") }, false},
		{"nothing new", func() {}, false},
		{"deletes", func() { exec(t, db, "DELETE FROM m WHERE id % 3 = 0") }, false},
		// A checkpoint that copied the whole WAL lets the next commit start it again.
		{"a passive checkpoint", func() { exec(t, db, "PRAGMA wal_checkpoint(PASSIVE)"); insert(t, db, 2, "c") }, true},
		{"after it", func() { insert(t, db, 2, "e") }, false},
		{"a truncating checkpoint", func() { exec(t, db, "PRAGMA wal_checkpoint(TRUNCATE)"); insert(t, db, 5, "d") }, true},
	}
	for _, s := range steps {
		s.step()
		since := pos
		locked, err := openLocked(ctx, nil, p, &since)
		if err != nil {
			t.Fatal(err)
		}
		follow, ok := followTail(p, &since)
		if s.restarts {
			if ok || locked.Shape().Tail {
				t.Fatalf("%s: the unlocked tail read a WAL restarted since its position (ok %v), or the locked one did (tail %v)", s.name, ok, locked.Shape().Tail)
			}
			pos = locked.Shape().Pos
			locked.Close()
			continue
		}
		if !ok {
			t.Fatalf("%s: the unlocked tail declined", s.name)
		}
		wantShape, wantChanged, wantData := tailOf(t, locked)
		gotShape, gotChanged, gotData := tailOf(t, follow)
		locked.Close()
		follow.Close()
		if gotShape != wantShape || !slices.Equal(gotChanged, wantChanged) {
			t.Fatalf("%s: unlocked shape %+v changed %v, locked %+v %v", s.name, gotShape, gotChanged, wantShape, wantChanged)
		}
		for pg, d := range wantData {
			if gotData[pg] != d {
				t.Fatalf("%s: page %d differs", s.name, pg)
			}
		}
		pos = wantShape.Pos
	}
}

// TestUnlockedTailNoticesARestartDuringItsRead: a checkpoint that truncates the WAL and a
// commit that starts it again, between the read of the frames and the second read of the
// header, make the unlocked tail decline.
func TestUnlockedTailNoticesARestartDuringItsRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "app.db")
	db := instanceDB(t, p)
	insert(t, db, 5, "0")
	pos := posNow(t, p)
	insert(t, db, 3, "a")
	followHook = func() { exec(t, db, "PRAGMA wal_checkpoint(TRUNCATE)"); insert(t, db, 1, "b") }
	t.Cleanup(func() { followHook = nil })
	if _, ok := followTail(p, &pos); ok {
		t.Fatal("the unlocked tail vouched for frames read while the WAL restarted")
	}
}

// TestUnlockedTailTakesOnlyCommittedFrames: a transaction that spills frames to the WAL
// before it commits shows nothing until its commit, and nothing at all once rolled back.
func TestUnlockedTailTakesOnlyCommittedFrames(t *testing.T) {
	p := filepath.Join(t.TempDir(), "app.db")
	db := instanceDB(t, p)
	exec(t, db, "PRAGMA cache_size = 2") // spills dirty pages to the WAL early
	insert(t, db, 5, "0")
	pos := posNow(t, p)
	for _, commit := range []bool{false, true} {
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		for i := range 200 {
			if _, err := tx.Exec("INSERT INTO m (body) VALUES (?)", fmt.Sprint(commit, i, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")); err != nil {
				t.Fatal(err)
			}
		}
		v, ok := followTail(p, &pos)
		if !ok {
			t.Fatal("the unlocked tail declined")
		}
		if sh, changed, _ := tailOf(t, v); sh.Pos != pos || len(changed) > 0 {
			t.Fatalf("during a transaction (commit %v): pos %+v and %d changed pages, want nothing new", commit, sh.Pos, len(changed))
		}
		v.Close()
		if !commit {
			tx.Rollback()
			continue
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		v, ok = followTail(p, &pos)
		if !ok {
			t.Fatal("the unlocked tail declined")
		}
		if sh, changed, _ := tailOf(t, v); sh.Pos.Frames <= pos.Frames || len(changed) == 0 {
			t.Fatalf("after the commit: pos %+v and %d changed pages", sh.Pos, len(changed))
		}
		v.Close()
	}
}

// TestTailViewsUnderWritersMissNothing: an instance commits, checkpoints and restarts its
// WAL all the while; a reader applies each view (a tail, unlocked when it can vouch for it,
// a restart it can follow included, else under the lock; a full view after a restart it
// cannot follow) to a copy of the pages, as the log shipper does. Once the writer stops,
// the copy is the database, page for page. Also with a journal_size_limit, which truncates
// the WAL at the first commit after each restart, over frames an unlocked tail may be
// reading.
func TestTailViewsUnderWritersMissNothing(t *testing.T) {
	for _, limit := range []int{-1, 64 << 10} {
		t.Run(fmt.Sprintf("journal_size_limit=%d", limit), func(t *testing.T) { tailViewsUnderWriters(t, limit) })
	}
}

func tailViewsUnderWriters(t *testing.T, limit int) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "app.db")
	db := instanceDB(t, p)
	insert(t, db, 5, "0")
	// The writer waits for a lock a view holds rather than fail.
	wdb, err := sql.Open("sqlite", "file:"+p+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	wdb.SetMaxOpenConns(1)
	defer wdb.Close()
	exec(t, wdb, fmt.Sprintf("PRAGMA journal_size_limit = %d", limit))
	var stop atomic.Bool
	var ops atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		r := rand.New(rand.NewPCG(1, 2))
		for i := 0; !stop.Load(); i++ {
			var err error
			switch n := r.IntN(100); {
			case n < 3: // a commit of more frames than a first read takes (followRead)
				_, err = wdb.Exec("WITH RECURSIVE k(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM k WHERE n < 60) INSERT INTO m (body) SELECT printf('%d-%0800d', ?, n) FROM k", i)
			case n < 75:
				_, err = wdb.Exec("INSERT INTO m (body) VALUES (?)", fmt.Sprintf("%d-%0200d", i, r.Int64()))
			case n < 96:
				_, err = wdb.Exec("UPDATE m SET body = ? WHERE id % 7 = ?", fmt.Sprint(i), r.IntN(7))
			case n < 98:
				_, err = wdb.Exec("PRAGMA wal_checkpoint(PASSIVE)")
			default:
				_, err = wdb.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
			}
			if err != nil {
				t.Error(err)
				return
			}
			ops.Add(1)
		}
	})
	image := map[uint32]string{}
	var pages uint32
	var since *WALPos
	var unlocked, restarts, locked, full int
	apply := func() {
		v, err := open(ctx, nil, p, since, true)
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		sh := v.Shape()
		switch {
		case v.unlocked:
			unlocked++
			if sh.Pos.Salt1 != since.Salt1 {
				restarts++
			}
		case sh.Tail:
			locked++
		default:
			full++
		}
		if sh.Tail {
			changed, _ := v.ChangedSinceTail()
			if err := v.ReadPages(changed, func(pg uint32, b []byte) error { image[pg] = string(b); return nil }); err != nil {
				t.Fatal(err)
			}
		} else {
			clear(image)
			if err := v.Scan(func(pg uint32, b []byte) error { image[pg] = string(b); return nil }); err != nil {
				t.Fatal(err)
			}
		}
		sh = v.Shape()
		pages = sh.Pages
		for pg := range image {
			if pg > pages {
				delete(image, pg)
			}
		}
		pos := sh.Pos
		since = &pos
	}
	for ops.Load() < 1500 && !t.Failed() {
		apply()
	}
	stop.Store(true)
	wg.Wait()
	apply()
	v, err := openLocked(ctx, nil, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	n := 0
	if err := v.Scan(func(pg uint32, b []byte) error {
		n++
		if image[pg] != string(b) {
			return fmt.Errorf("page %d of %d differs from the database's", pg, v.Shape().Pages)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if uint32(n) != pages || len(image) != n {
		t.Fatalf("the copy has %d pages (size %d), the database %d", len(image), pages, n)
	}
	t.Logf("%d writer's statements, %d views: %d tails unlocked (%d across a restart), %d tails locked, %d full; %d pages",
		ops.Load(), unlocked+locked+full, unlocked, restarts, locked, full, n)
	if unlocked == 0 || full == 0 {
		t.Fatalf("the writer's pace left a kind of view untried (%d unlocked, %d full)", unlocked, full)
	}
}

// TestOnlyLogTailsGoWithoutTheLock: a tail view a log segment asks for (Keeper.OpenTail,
// Session.OpenTail) lets the instance write while it is open; one a checkpoint asks for
// (Open, Keeper.Open, Session.Open), which may read any page, holds the lock, in process
// and through the helper's wire alike.
func TestOnlyLogTailsGoWithoutTheLock(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "app.db")
	db := instanceDB(t, p) // busy_timeout 0: a write that meets the lock fails at once
	insert(t, db, 5, "0")
	k := NewKeeper()
	defer k.Close()
	r, w, _ := pipeHelper(t)
	s := NewSession(r, w)
	opens := []struct {
		name     string
		open     func(since *WALPos) (Source, error)
		unlocked bool
	}{
		{"Open", func(since *WALPos) (Source, error) { return Open(ctx, p, since) }, false},
		{"Keeper.Open", func(since *WALPos) (Source, error) { return k.Open(ctx, p, since) }, false},
		{"Session.Open", func(since *WALPos) (Source, error) { return s.Open(p, since, boxFiles(t, p)) }, false},
		{"Keeper.OpenTail", func(since *WALPos) (Source, error) { return k.OpenTail(ctx, p, since) }, true},
		{"Session.OpenTail", func(since *WALPos) (Source, error) { return s.OpenTail(p, since, boxFiles(t, p)) }, true},
	}
	for _, o := range opens {
		pos := posNow(t, p)
		insert(t, db, 1, "a")
		v, err := o.open(&pos)
		if err != nil {
			t.Fatal(err)
		}
		if sh := v.Shape(); !sh.Tail {
			t.Fatalf("%s: not a tail view", o.name)
		}
		_, err = db.Exec("INSERT INTO m (body) VALUES ('b')")
		v.Close()
		if o.unlocked && err != nil {
			t.Fatalf("%s: the instance's write met a lock: %v", o.name, err)
		}
		if !o.unlocked && !busy(err) {
			t.Fatalf("%s: the instance wrote while the view was open (%v): a checkpoint's view went without the lock", o.name, err)
		}
	}
	w.Close()
}

// imageOf is every page of the database at p as a locked view reads it.
func imageOf(t *testing.T, p string) map[uint32]string {
	t.Helper()
	v, err := openLocked(context.Background(), nil, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	img := map[uint32]string{}
	if err := v.Scan(func(pg uint32, b []byte) error { img[pg] = string(b); return nil }); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestUnlockedTailFollowsOneRestart: commits after a WALPos, a checkpoint that copies them
// all into the main file, and commits that start the WAL again with new salts: the tail
// without the lock takes the old salts' frames after the WALPos (still in the file, ended
// by a frame of an earlier use of it) and the new ones, and applied to the database as it
// stood at the WALPos they give the database as it is, with no page compared. It declines
// when it cannot prove it has every old frame: they run to the end of the file, a
// journal_size_limit truncated them, the new frames overwrote them, or the WAL restarted
// twice.
func TestUnlockedTailFollowsOneRestart(t *testing.T) {
	// setUp leaves a WAL whose file runs on past its current frames (a longer first use
	// of it), a WALPos among them, and the database as it stood there.
	setUp := func(t *testing.T, db *sql.DB, p string) (WALPos, map[uint32]string) {
		insert(t, db, 120, "a")                       // a long first use of the WAL
		exec(t, db, "PRAGMA wal_checkpoint(RESTART)") // the next commit restarts it
		insert(t, db, 30, "b")
		pos, img := posNow(t, p), imageOf(t, p)
		insert(t, db, 10, "c")
		exec(t, db, "UPDATE m SET body = 'changed' WHERE id % 5 = 0")
		return pos, img
	}
	check := func(t *testing.T, p string, pos WALPos, img map[uint32]string) {
		t.Helper()
		v, ok := followTail(p, &pos)
		if !ok {
			t.Fatal("the unlocked tail declined one restart after its WALPos")
		}
		defer v.Close()
		sh, changed, data := tailOf(t, v)
		if sh.Pos.Salt1 != pos.Salt1+1 || !sh.Tail {
			t.Fatalf("shape %+v after a restart from %+v", sh, pos)
		}
		for _, pg := range changed {
			img[pg] = data[pg]
		}
		for pg := range img {
			if pg > sh.Pages {
				delete(img, pg)
			}
		}
		want := imageOf(t, p)
		if len(want) != len(img) || uint32(len(want)) != sh.Pages {
			t.Fatalf("the copy has %d pages, the database %d (shape %d)", len(img), len(want), sh.Pages)
		}
		for pg, d := range want {
			if img[pg] != d {
				t.Fatalf("page %d differs from the database's (%d pages changed in the tail)", pg, len(changed))
			}
		}
		if next := posNow(t, p); sh.Pos != next {
			t.Fatalf("the tail's WALPos %+v, the WAL's %+v", sh.Pos, next)
		}
	}
	restart := func(t *testing.T, db *sql.DB, n int) {
		exec(t, db, "PRAGMA wal_checkpoint(PASSIVE)")
		insert(t, db, n, "d")
	}
	t.Run("followed", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "app.db")
		db := instanceDB(t, p)
		pos, img := setUp(t, db, p)
		restart(t, db, 3)
		check(t, p, pos, img)
	})
	declines := []struct {
		name string
		step func(t *testing.T, db *sql.DB, pos WALPos)
	}{
		{"the old frames end the file", func(t *testing.T, db *sql.DB, pos WALPos) {
			insert(t, db, 200, "e") // past the first use's end
			restart(t, db, 3)
		}},
		{"a journal_size_limit truncated them", func(t *testing.T, db *sql.DB, pos WALPos) {
			// The file ends a few frames past the WALPos, within the old frames after it.
			exec(t, db, fmt.Sprintf("PRAGMA journal_size_limit = %d", 32+(pos.Frames+3)*(24+4096)))
			restart(t, db, 3)
		}},
		{"a journal_size_limit truncated the WAL before the WALPos", func(t *testing.T, db *sql.DB, pos WALPos) {
			exec(t, db, "PRAGMA journal_size_limit = 40000") // about 10 frames
			restart(t, db, 3)
		}},
		{"the new frames overwrote them", func(t *testing.T, db *sql.DB, pos WALPos) {
			restart(t, db, 45) // past the WALPos
		}},
		{"two restarts", func(t *testing.T, db *sql.DB, pos WALPos) {
			restart(t, db, 3)
			restart(t, db, 3)
		}},
	}
	for _, c := range declines {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "app.db")
			db := instanceDB(t, p)
			pos, _ := setUp(t, db, p)
			c.step(t, db, pos)
			if v, ok := followTail(p, &pos); ok {
				v.Close()
				t.Fatal("the unlocked tail vouched for a restart it cannot prove it followed whole")
			}
		})
	}
}

// TestUnlockedTailsKeepTheirPages: the buffers a tail reads its frames into are reused by
// later tails' reads; the pages a view took stay its own while other tails read and end.
func TestUnlockedTailsKeepTheirPages(t *testing.T) {
	p := filepath.Join(t.TempDir(), "app.db")
	db := instanceDB(t, p)
	insert(t, db, 1, "0")
	early := posNow(t, p)
	insert(t, db, 5, "0")
	pos := posNow(t, p)
	insert(t, db, 40, "a") // more frames than a first chunk
	first, ok := followTail(p, &pos)
	if !ok {
		t.Fatal("the unlocked tail declined")
	}
	defer first.Close()
	_, _, want := tailOf(t, first)
	exec(t, db, "UPDATE m SET body = 'overwritten'")
	for range 10 { // read other frames into the buffers first gave back
		v, ok := followTail(p, &early)
		if !ok {
			t.Fatal("the unlocked tail declined")
		}
		v.Close()
	}
	if _, _, got := tailOf(t, first); !maps.Equal(got, want) {
		t.Fatal("a tail's pages changed under it once later tails read the WAL")
	}
}
