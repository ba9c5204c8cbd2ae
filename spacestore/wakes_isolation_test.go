package spacestore

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The instance controls every name under its data dir; the box reads next-wake with more
// privileges than the instance, so the file must not lead it elsewhere or stall it.
func TestReadNextWakeStaysInTheDataDir(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "registry.db")
	os.WriteFile(secret, []byte("TOP-SECRET-ENV-VALUE"), 0o600)

	link := t.TempDir()
	os.MkdirAll(filepath.Join(link, ".lchat"), 0o700)
	os.Symlink(secret, filepath.Join(link, ".lchat", "next-wake"))
	if _, err := ReadNextWake(link); err == nil || strings.Contains(err.Error(), "TOP-SECRET") {
		t.Errorf("next-wake as a symlink out of the data dir: %v, want refused without its content", err)
	}

	dirLink := t.TempDir()
	os.Symlink(filepath.Dir(secret), filepath.Join(dirLink, ".lchat"))
	os.Rename(secret, filepath.Join(filepath.Dir(secret), "next-wake"))
	if _, err := ReadNextWake(dirLink); err == nil || strings.Contains(err.Error(), "TOP-SECRET") {
		t.Errorf(".lchat as a symlink out of the data dir: %v, want refused without its content", err)
	}

	fifo := t.TempDir()
	os.MkdirAll(filepath.Join(fifo, ".lchat"), 0o700)
	if err := syscall.Mkfifo(filepath.Join(fifo, ".lchat", "next-wake"), 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := ReadNextWake(fifo); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a FIFO next-wake was accepted")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ReadNextWake blocked on a FIFO")
	}

	bad := t.TempDir()
	os.MkdirAll(filepath.Join(bad, ".lchat"), 0o700)
	os.WriteFile(filepath.Join(bad, ".lchat", "next-wake"), []byte("not-a-time-SECRET"), 0o600)
	if _, err := ReadNextWake(bad); err == nil || strings.Contains(err.Error(), "SECRET") {
		t.Errorf("unparsable next-wake: %v, want an error that does not quote the file", err)
	}

	good := t.TempDir()
	os.MkdirAll(filepath.Join(good, ".lchat"), 0o700)
	os.WriteFile(filepath.Join(good, ".lchat", "next-wake"), []byte("2030-01-02T03:04:05Z\n"), 0o600)
	if at, err := ReadNextWake(good); err != nil || at == nil || at.Year() != 2030 {
		t.Errorf("a plain next-wake: %v %v", at, err)
	}
}
