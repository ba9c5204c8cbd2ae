package demospace

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestOwnerOnly: the data directory (SQLite creates chat.db 0644 inside it), the
// socket's directory and the socket are the owner's alone, whatever the umask allows, so another user on the box can neither
// read the room's database nor talk to the space past the proxy.
func TestOwnerOnly(t *testing.T) {
	old := syscall.Umask(0o002)
	defer syscall.Umask(old)
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "s.sock")
	data := filepath.Join(dir, "spaces", "a", "data")
	s := startSpaceAt(t, sock, data, newFakeClock(time.Unix(1700000000, 0)))
	if code, _ := s.do("GET", "/healthz", "", ""); code != 200 {
		t.Fatalf("healthz = %d", code)
	}
	for _, p := range []string{sock, filepath.Dir(sock), data} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s has mode %v, want no group or other bits", p, fi.Mode().Perm())
		}
	}
}
