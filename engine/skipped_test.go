package engine

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/spacestore"
)

// TestSleepWithOddFilesInDataDir: an instance leaves a FIFO at next-wake, a socket, a
// device node and symlinks in its data dir. The sleep neither blocks (a FIFO at
// next-wake used to hang it with the operation lock held) nor fails (a symlink used to
// fail every checkpoint): the regular files reach the bucket, the odd ones are counted.
func TestSleepWithOddFilesInDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real instance")
	}
	e := newAwakeTestEngine(t, 0)
	const host = "odd.example.com"
	u, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	in := e.lookup(host)
	d := in.dataDir
	os.MkdirAll(filepath.Join(d, ".lchat"), 0o700)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(d, "notes.txt"), []byte("acknowledged write\n"), 0o600))
	must(syscall.Mkfifo(filepath.Join(d, filepath.FromSlash(spacestore.NextWakeFile)), 0o600))
	ln, err := net.Listen("unix", filepath.Join(d, "app.sock"))
	must(err)
	defer ln.Close()
	want := uint64(3) // next-wake, app.sock, link
	if err := syscall.Mknod(filepath.Join(d, "null"), syscall.S_IFCHR|0o600, 1<<8|3); err == nil {
		want++
	}
	must(os.Symlink("/etc/passwd", filepath.Join(d, "link")))
	u.Release()

	done := make(chan error, 1)
	go func() { done <- e.Sleep(context.Background(), host) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("sleep: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("sleep blocked on an odd file in the data dir")
	}
	m, _, err := spacestore.ReadManifest(context.Background(), e.cfg.Bucket, host)
	if err != nil || m == nil {
		t.Fatalf("manifest after sleep = %v, %v", m, err)
	}
	var paths []string
	for _, f := range m.Files {
		paths = append(paths, f.Path)
	}
	if len(paths) != 1 || paths[0] != "notes.txt" {
		t.Fatalf("checkpointed files = %v, want [notes.txt]", paths)
	}
	// The FIFO is skipped twice: once as next-wake, once by the walk.
	if got := e.Counters().SkippedFiles; got != want+1 {
		t.Fatalf("skipped_files = %d, want %d", got, want+1)
	}
	if st := stateOf(in); st != StateAsleep {
		t.Fatalf("state after sleep = %s, want asleep", st)
	}
}
