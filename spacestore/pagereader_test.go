package spacestore

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/sandbox"
	"github.com/lchat/lchat-caddy/spacestore/pageread/pagereadtest"
)

// The page reader's tests run lchat-pageread under a space's uid: they need root (CI runs
// as root).
const testSpaceUID = 3201000

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the page reader under another uid (CI runs as root)")
	}
}

// spaceDir makes a directory the space's uid can reach (0711 above its data dir) and
// returns a syncer on it whose databases are read by lchat-pageread under uid. started,
// when non-nil, is told each helper's pid.
func spaceDir(t testing.TB, b bucket.Bucket, uid uint32, started func(pid int)) *Syncer {
	t.Helper()
	dir, err := os.MkdirTemp("", "pagereader")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o711)
	s := newSyncer(t, b, dir)
	if err := os.Mkdir(s.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.Chown(s.DataDir, int(uid), int(uid))
	s.PageReader = &PageReader{Path: pagereadtest.Binary(t), UID: uid, GID: uid,
		Start: func(cmd *exec.Cmd) (func(), error) {
			release, err := sandbox.StartHelper(cmd)
			if err == nil && started != nil {
				started(cmd.Process.Pid)
			}
			return release, err
		}}
	return s
}

// handTo gives every file under dir to uid, as the engine does for an isolated space.
func handTo(t testing.TB, dir string, uid int) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			os.Lchown(p, uid, uid)
		}
		return nil
	})
}

// bucketContents is every object of b, by key.
func bucketContents(t *testing.T, b bucket.Bucket) map[string][]byte {
	t.Helper()
	ctx := context.Background()
	objs, err := listAll(ctx, b, "")
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string][]byte)
	for _, o := range objs {
		out[o.Key] = []byte(readAllKey(t, b, o.Key))
	}
	return out
}

func readAllKey(t *testing.T, b bucket.Bucket, key string) string {
	t.Helper()
	o, err := b.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(o.Body)
	return buf.String()
}

// TestPageReaderGivesTheSameCheckpoints: the same data dir checkpointed step by step in
// this process and through lchat-pageread under the space's uid writes byte-identical
// objects and manifests (full scans, WAL tails, deltas, merges, a rebase, a final fold),
// in WAL and rollback-journal mode, and both restore.
func TestPageReaderGivesTheSameCheckpoints(t *testing.T) {
	needRoot(t)
	for _, mode := range []string{"WAL", "DELETE"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			local, remote := backends["file"](t), backends["file"](t)
			h := spaceDir(t, remote, testSpaceUID, nil)
			l := &Syncer{Bucket: local, Host: h.Host, DataDir: h.DataDir, WorkDir: filepath.Join(t.TempDir(), "work"), WrittenBy: "box"}
			p := filepath.Join(h.DataDir, "app.db")
			db := openDB(t, p)
			if _, err := db.Exec("PRAGMA journal_mode=" + mode); err != nil {
				t.Fatal(err)
			}
			fillDB(t, db, 3000, 1000)
			now := time.Unix(1764547200, 0)
			for i := range 24 {
				switch {
				case i == 9:
					db.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
				case i == 15:
					db.Exec("DELETE FROM messages WHERE id % 5 = 0")
				default:
					fillDB(t, db, 1+i*7, 1000)
				}
				handTo(t, h.DataDir, testSpaceUID) // the test writes as root; the space owns its files
				m := Periodic
				if i == 23 {
					m = Final
				}
				now = now.Add(time.Minute)
				ls, err := l.Checkpoint(ctx, m, nil, now)
				if err != nil {
					t.Fatalf("step %d in this process: %v", i, err)
				}
				rs, err := h.Checkpoint(ctx, m, nil, now)
				if err != nil {
					t.Fatalf("step %d through the page reader: %v", i, err)
				}
				if ls.PagesChanged != rs.PagesChanged || ls.FullScans != rs.FullScans || ls.BytesUploaded != rs.BytesUploaded {
					t.Fatalf("step %d: in process %+v, page reader %+v", i, ls, rs)
				}
			}
			lc, rc := bucketContents(t, local), bucketContents(t, remote)
			if len(lc) != len(rc) {
				t.Fatalf("%d objects in process, %d through the page reader", len(lc), len(rc))
			}
			var keys []string
			for k := range lc {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if !bytes.Equal(lc[k], rc[k]) {
					t.Fatalf("object %s differs between the two readers", k)
				}
			}
			var n int
			db.QueryRow("SELECT count(*) FROM messages").Scan(&n)
			if got := rows(t, filepath.Join(restoreInto(t, remote).DataDir, "app.db")); got != n {
				t.Fatalf("restored %d rows, the database has %d", got, n)
			}
		})
	}
}

// TestPageReaderRunsAsTheSpace: the helper reads with the space's privileges, not the
// box's: a database only the space's uid may read is checkpointed, one only root may read
// fails though the box is root; the helper has the space's uid and gid, no supplementary
// groups, no capabilities, and is not in any cgroup of the space.
func TestPageReaderRunsAsTheSpace(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	var mu sync.Mutex
	var status, cgroup string
	seen := func(pid int) {
		// The helper waits for its first request: its credentials are settled by now.
		st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		cg, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
		mu.Lock()
		status, cgroup = string(st), string(cg)
		mu.Unlock()
	}
	s := spaceDir(t, backends["file"](t), testSpaceUID, seen)
	p := filepath.Join(s.DataDir, "app.db")
	db := openDB(t, p)
	fillDB(t, db, 50, 100)
	db.Close()
	handTo(t, s.DataDir, testSpaceUID)
	os.Chmod(p, 0o600)
	if _, err := s.Checkpoint(ctx, Final, nil, time.Now()); err != nil {
		t.Fatalf("a database readable by the space's uid only: %v", err)
	}
	mu.Lock()
	want := map[string]string{"Uid": "3201000", "Gid": "3201000", "Groups": "", "CapInh": "0000000000000000",
		"CapPrm": "0000000000000000", "CapEff": "0000000000000000", "CapAmb": "0000000000000000"}
	for l := range strings.SplitSeq(status, "\n") {
		k, v, _ := strings.Cut(l, ":")
		if w, ok := want[k]; ok {
			if f := strings.Fields(v); (len(f) == 0 && w != "") || (len(f) > 0 && f[0] != w) || (w == "" && len(f) > 0) {
				t.Errorf("helper's %s: %q, want %q", k, strings.TrimSpace(v), w)
			}
			delete(want, k)
		}
	}
	if len(want) > 0 {
		t.Errorf("helper's status lacks %v:\n%s", want, status)
	}
	own, _ := os.ReadFile("/proc/self/cgroup")
	if cgroup != string(own) {
		t.Errorf("helper in cgroup %q, the box in %q: it must stay outside the space's", cgroup, own)
	}
	mu.Unlock()

	// The same database, now root's alone: the box could read it, the space cannot.
	os.Chown(p, 0, 0)
	fillDBAsRoot(t, p)
	_, err := s.Checkpoint(ctx, Final, nil, time.Now())
	if err == nil {
		t.Fatal("a database only root may read was checkpointed through the space's page reader")
	}
	if !strings.Contains(err.Error(), "app.db") || !strings.Contains(err.Error(), "page reader") {
		t.Fatalf("error does not name the database and the page reader: %v", err)
	}
	t.Logf("root-only database: %v", err)
}

// fillDBAsRoot changes the database at p (so the next checkpoint reads it) and leaves it
// and its files root's, 0600.
func fillDBAsRoot(t *testing.T, p string) {
	t.Helper()
	db := openDB(t, p)
	fillDB(t, db, 5, 100)
	db.Close()
	for _, f := range []string{p, p + "-wal", p + "-shm"} {
		os.Chown(f, 0, 0)
		os.Chmod(f, 0o600)
	}
}

// TestPageReaderKilledAtItsDeadline: a helper that cannot finish (here: the instance holds
// its database's write lock, frozen mid-transaction, and SQLite's busy timeout is 10 s) is
// killed at its deadline and the checkpoint says so.
func TestPageReaderKilledAtItsDeadline(t *testing.T) {
	needRoot(t)
	s := spaceDir(t, backends["file"](t), testSpaceUID, nil)
	s.PageReader.Timeout = 300 * time.Millisecond
	p := filepath.Join(s.DataDir, "app.db")
	db := openDB(t, p)
	fillDB(t, db, 50, 100)
	handTo(t, s.DataDir, testSpaceUID)
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(context.Background(), "ROLLBACK")
	_, err = s.Checkpoint(context.Background(), Periodic, nil, time.Now())
	if err == nil || !strings.Contains(err.Error(), "page reader killed at its deadline (300ms for an answer)") {
		t.Fatalf("checkpoint with the write lock held: %v, want the helper killed at its deadline", err)
	}
}

// TestPageReaderMemoryBound: the helper runs under its RLIMIT_AS; one too small for it
// fails the checkpoint cleanly, naming the page reader.
func TestPageReaderMemoryBound(t *testing.T) {
	needRoot(t)
	s := spaceDir(t, backends["file"](t), testSpaceUID, nil)
	s.PageReader.MaxMemory = 8 << 20
	p := filepath.Join(s.DataDir, "app.db")
	db := openDB(t, p)
	fillDB(t, db, 2000, 1000)
	db.Close()
	handTo(t, s.DataDir, testSpaceUID)
	_, err := s.Checkpoint(context.Background(), Periodic, nil, time.Now())
	if err == nil || !strings.Contains(err.Error(), "page reader") {
		t.Fatalf("checkpoint under an 8 MiB address space: %v, want the page reader's failure", err)
	}
	t.Logf("8 MiB: %v", err)
	s.PageReader.MaxMemory = 0 // the default
	if _, err := s.Checkpoint(context.Background(), Periodic, nil, time.Now()); err != nil {
		t.Fatalf("checkpoint under the default bound: %v", err)
	}
}

// TestPageReaderRefusesCraftedDatabases: files an instance crafts fail that space's
// checkpoint cleanly, with an error naming the file, within the deadline; the helper never
// reads through a link the space planted, and the next checkpoint of a sane space works.
func TestPageReaderRefusesCraftedDatabases(t *testing.T) {
	needRoot(t)
	secretDir := t.TempDir() // root's, 0700: another space's or the box's
	secret := filepath.Join(secretDir, "secret.db")
	sdb := openDB(t, secret)
	fillDB(t, sdb, 20, 100) // its WAL holds the rows
	header := func(mut func(h []byte)) func(t *testing.T, p string) {
		return func(t *testing.T, p string) {
			db := openDB(t, p)
			fillDB(t, db, 20, 100)
			db.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
			db.Close()
			b, _ := os.ReadFile(p)
			mut(b)
			os.WriteFile(p, b, 0o600)
		}
	}
	cases := []struct {
		name  string
		craft func(t *testing.T, p string)
		want  string
	}{
		// SQLite's own parser, run by the helper, refuses these before the page reader's
		// checks would.
		{"page size 3", header(func(h []byte) { h[16], h[17] = 0, 3 }), "not a database"},
		{"huge page count", header(func(h []byte) {
			copy(h[28:32], []byte{0xff, 0xff, 0xff, 0xf0})
			copy(h[92:96], h[24:28])
		}), "malformed"},
		{"65536-byte pages in a small file", header(func(h []byte) {
			h[16], h[17] = 0, 1
			copy(h[28:32], []byte{0, 0, 0, 9})
			copy(h[92:96], h[24:28])
		}), "malformed"},
		{"WAL is a FIFO", func(t *testing.T, p string) {
			header(func([]byte) {})(t, p)
			os.Remove(p + "-wal")
			if err := syscall.Mkfifo(p+"-wal", 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"WAL is a link to another database's", func(t *testing.T, p string) {
			header(func([]byte) {})(t, p)
			os.Remove(p + "-wal")
			os.Symlink(secret+"-wal", p+"-wal")
		}, "not a regular file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := spaceDir(t, backends["file"](t), testSpaceUID, nil)
			s.PageReader.Timeout = 10 * time.Second
			p := filepath.Join(s.DataDir, "app.db")
			c.craft(t, p)
			handTo(t, s.DataDir, testSpaceUID)
			done := make(chan error, 1)
			go func() {
				_, err := s.Checkpoint(context.Background(), Periodic, nil, time.Now())
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				t.Fatal("checkpoint of a crafted database still running after a minute")
			}
			if err == nil {
				t.Fatal("checkpoint of a crafted database succeeded")
			}
			if !strings.Contains(err.Error(), "app.db") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want it to name app.db and say %q", err, c.want)
			}
			var pe *fs.PathError
			if errors.As(err, &pe) && strings.HasPrefix(pe.Path, secretDir) {
				t.Fatalf("read through the link: %v", err)
			}
			// The space repairs its file: the next checkpoint works.
			os.Remove(p + "-wal")
			os.Remove(p + "-shm")
			os.Remove(p)
			db := openDB(t, p)
			fillDB(t, db, 5, 100)
			db.Close()
			handTo(t, s.DataDir, testSpaceUID)
			if _, err := s.Checkpoint(context.Background(), Periodic, nil, time.Now()); err != nil {
				t.Fatalf("checkpoint after the repair: %v", err)
			}
		})
	}
}

// TestMissingPageReaderNamesIt: without the binary a checkpoint of a database fails naming
// the path it looked at.
func TestMissingPageReaderNamesIt(t *testing.T) {
	needRoot(t)
	s := spaceDir(t, backends["file"](t), testSpaceUID, nil)
	s.PageReader.Path = "/nonexistent/lchat-pageread"
	db := openDB(t, filepath.Join(s.DataDir, "app.db"))
	fillDB(t, db, 5, 100)
	db.Close()
	_, err := s.Checkpoint(context.Background(), Periodic, nil, time.Now())
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/lchat-pageread") {
		t.Fatalf("checkpoint without the page reader: %v", err)
	}
}
