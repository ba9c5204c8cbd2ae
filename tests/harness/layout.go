package harness

import (
	"os"
	"path/filepath"
	"testing"
)

// IsolatedLayout makes dir what the shipped unit makes /var/lib/lchat-caddy: a directory
// and a state directory the spaces' uids may traverse (0711), and returns a copy of bin
// inside it, so "{self}" (an isolated kind's command) is reachable whatever the
// checkout's path, with a copy of lchat-pageread beside it, where the copy looks for it.
// tests/certs keeps its own copy of this rule.
func IsolatedLayout(t testing.TB, dir, bin string) string {
	t.Helper()
	for _, d := range []string{dir, filepath.Join(dir, "state")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			t.Fatal(err)
		}
		os.Chmod(d, 0o711)
	}
	for _, p := range []string{PageReader(t), bin} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(p)), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, filepath.Base(bin))
}
