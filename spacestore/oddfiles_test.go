package spacestore

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

// makeOdd creates one file of the named kind at p.
func makeOdd(t *testing.T, kind, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	var err error
	switch kind {
	case "fifo":
		err = syscall.Mkfifo(p, 0o600)
	case "socket":
		var ln net.Listener
		ln, err = net.Listen("unix", p)
		if err == nil {
			t.Cleanup(func() { ln.Close() })
		}
	case "device":
		// /dev/null's numbers (1, 3): creating a device node needs CAP_MKNOD.
		err = syscall.Mknod(p, syscall.S_IFCHR|0o600, 1<<8|3)
		if errors.Is(err, syscall.EPERM) {
			t.Skip("mknod not permitted here")
		}
	case "symlink":
		target := filepath.Join(t.TempDir(), "outside")
		os.WriteFile(target, []byte("2030-01-01T00:00:00Z"), 0o600)
		err = os.Symlink(target, p)
	case "dangling symlink":
		err = os.Symlink("/nonexistent/next-wake", p)
	case "directory symlink":
		err = os.Symlink(t.TempDir(), p)
	case "directory":
		err = os.Mkdir(p, 0o700)
	default:
		t.Fatalf("unknown kind %s", kind)
	}
	if err != nil {
		t.Fatalf("creating %s: %v", kind, err)
	}
}

var oddKinds = []string{"fifo", "socket", "device", "symlink", "dangling symlink", "directory symlink"}

// TestReadNextWakeRefusesOddFiles: next-wake is read only when it is a small regular
// file. A FIFO with no writer used to block the read, and with it the checkpoint under
// the space's operation lock, forever.
func TestReadNextWakeRefusesOddFiles(t *testing.T) {
	for _, kind := range append(oddKinds, "directory") {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			makeOdd(t, kind, filepath.Join(dir, filepath.FromSlash(NextWakeFile)))
			done := make(chan error, 1)
			go func() { _, err := ReadNextWake(dir); done <- err }()
			select {
			case err := <-done:
				if !errors.Is(err, ErrNotRegular) {
					t.Fatalf("ReadNextWake of a %s = %v, want ErrNotRegular", kind, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("ReadNextWake of a %s blocked", kind)
			}
		})
	}
	t.Run("too large", func(t *testing.T) {
		dir := t.TempDir()
		p := filepath.Join(dir, filepath.FromSlash(NextWakeFile))
		os.MkdirAll(filepath.Dir(p), 0o700)
		os.WriteFile(p, make([]byte, 1<<20), 0o600)
		if _, err := ReadNextWake(dir); !errors.Is(err, ErrNotRegular) {
			t.Fatalf("ReadNextWake of a 1 MiB file = %v, want ErrNotRegular", err)
		}
	})
	t.Run("regular", func(t *testing.T) {
		dir := t.TempDir()
		p := filepath.Join(dir, filepath.FromSlash(NextWakeFile))
		os.MkdirAll(filepath.Dir(p), 0o700)
		os.WriteFile(p, []byte("2030-01-02T03:04:05Z\n"), 0o600)
		got, err := ReadNextWake(dir)
		if err != nil || got == nil || !got.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) {
			t.Fatalf("ReadNextWake = %v, %v", got, err)
		}
	})
}

// TestCheckpointSkipsOddFiles: a data dir holding a FIFO, socket, device node or symlink
// still checkpoints: the odd file is left out and listed, the regular files are saved. A
// symlink used to fail every checkpoint, so the space never persisted.
func TestCheckpointSkipsOddFiles(t *testing.T) {
	for _, kind := range oddKinds {
		t.Run(kind, func(t *testing.T) {
			b, err := filebucket.New(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			data := t.TempDir()
			os.WriteFile(filepath.Join(data, "notes.txt"), []byte("kept"), 0o600)
			makeOdd(t, kind, filepath.Join(data, "sub", "odd"))
			s := &Syncer{Bucket: b, Host: "odd.example.com", DataDir: data, WorkDir: t.TempDir(), WrittenBy: "test"}
			ctx := context.Background()
			if err := s.Load(ctx); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			var st Stats
			go func() { defer close(done); st, err = s.Checkpoint(ctx, Periodic, nil, time.Now()) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("checkpoint with a %s blocked", kind)
			}
			if err != nil {
				t.Fatalf("checkpoint with a %s: %v", kind, err)
			}
			if len(st.Skipped) != 1 || st.Skipped[0].Path != "sub/odd" {
				t.Fatalf("skipped = %+v, want sub/odd", st.Skipped)
			}
			m, _ := s.Manifest()
			if m == nil || len(m.Files) != 1 || m.Files[0].Path != "notes.txt" {
				t.Fatalf("manifest = %+v, want only notes.txt", m)
			}
		})
	}
}
