package single

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// copyBinary puts a copy of lchat-caddy at path (making its directories, searchable).
func copyBinary(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(harness.Binary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// The commands dev prints work as printed: they name the binary as it was invoked
// (here ./tools/lchat-caddy, which is not on PATH), and typed in the same directory they
// add a space and list it.
func TestDevBannerCommandsWorkAsPrinted(t *testing.T) {
	dir, home := t.TempDir(), t.TempDir()
	copyBinary(t, filepath.Join(dir, "tools", "lchat-caddy"))
	d := startDevWith(t, dir, home, devOpts{bin: "./tools/lchat-caddy"})

	add := d.bannerCommand(t, "Add a space:")
	if add[0] != "./tools/lchat-caddy" || add[1] != "add-instance" {
		t.Fatalf("dev printed %q to add a space, want it to start with ./tools/lchat-caddy add-instance", add)
	}
	for _, c := range [][]string{add, d.bannerCommand(t, "List routes:")} {
		cmd := exec.Command(c[0], c[1:]...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + home}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the printed command %q: %v\n%s", c, err, out)
		}
		if !strings.Contains(string(out), "chat.localhost") {
			t.Fatalf("the printed command %q printed %q, want chat.localhost in it", c, out)
		}
	}
}

// A binary `go run` built lives in a temporary directory that is gone when it exits: dev
// prints `go run` and the package instead, relative to the directory it runs in.
func TestDevBannerUnderGoRun(t *testing.T) {
	dir, home := t.TempDir(), t.TempDir()
	bin := filepath.Join(dir, "go-build1234", "b001", "exe", "lchat-caddy")
	copyBinary(t, bin)
	for _, c := range []struct{ cwd, want string }{
		{harness.RepoRoot(), "./cmd/lchat-caddy"},
		{filepath.Join(harness.RepoRoot(), "docs"), "../cmd/lchat-caddy"},
	} {
		d := startDevWith(t, dir, home, devOpts{bin: bin, cwd: c.cwd})
		for _, label := range []string{"Add a space:", "List routes:"} {
			got := d.bannerCommand(t, label)
			if len(got) < 3 || got[0] != "go" || got[1] != "run" || got[2] != c.want {
				t.Errorf("in %s dev printed %q after %q, want it to start with go run %s", c.cwd, got, label, c.want)
				continue
			}
			if _, err := os.Stat(filepath.Join(c.cwd, got[2], "main.go")); err != nil {
				t.Errorf("the printed package %s is not there from %s: %v", got[2], c.cwd, err)
			}
		}
		d.interrupt(t)
	}
}

// demoSpaceUID is the uid of the running demo-space process of bin.
func demoSpaceUID(t *testing.T, bin string) (string, bool) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) < 2 || args[0] != bin || args[1] != "demo-space" {
			continue
		}
		status, err := os.ReadFile(filepath.Join(filepath.Dir(p), "status"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(status), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
				return f[1], true
			}
		}
	}
	return "", false
}

// `lchat-caddy dev` as root runs the demo space under its own uid: it makes its
// directory searchable (0711) so the space's uid reaches its state, as the engine
// requires.
func TestDevAsRootIsolatesTheDemoSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: dev isolates the demo space only as root")
	}
	// Every directory above --dir is searchable, and the binary is reachable: only dev's
	// own directory decides.
	dir, err := os.MkdirTemp("", "lcd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := harness.IsolatedLayout(t, dir, harness.Binary(t))
	devDir := filepath.Join(dir, "lchat-dev")
	d := startDevWith(t, dir, t.TempDir(), devOpts{bin: bin, devDir: devDir})
	if first := strings.TrimSpace(strings.Join(d.banner, "\n")); strings.HasPrefix(first, "Isolation off") {
		if !strings.Contains(first, devDir) {
			t.Skipf("this machine cannot isolate spaces:\n%s", first)
		}
		t.Fatalf("dev as root did not isolate the demo space:\n%s", strings.Join(d.banner, "\n"))
	}
	if fi, err := os.Stat(devDir); err != nil || fi.Mode().Perm() != 0o711 {
		t.Fatalf("dev's directory as root: %v %v, want mode 0711", fi.Mode().Perm(), err)
	}
	if code, body := d.do(t, "GET", "/", ""); code != 200 {
		t.Fatalf("GET / on the demo space: %d %.200s", code, body)
	}
	uid, ok := demoSpaceUID(t, bin)
	if !ok {
		t.Fatal("no demo-space process after a request woke it")
	}
	if uid == "0" {
		t.Fatal("the demo space runs as root, not under its own uid")
	}
	d.interrupt(t)
}

// When the demo space cannot be isolated (here: a directory above --dir that the spaces'
// uids cannot search), dev says why first, before its URLs, not only in an info line of
// its log.
func TestDevSaysWhyNotIsolated(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: as another user dev opts out of isolation")
	}
	dir := t.TempDir() // 0700: the spaces' uids cannot search it
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	d := startDevWith(t, dir, t.TempDir(), devOpts{})
	var lines []string
	for _, l := range d.banner {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "Isolation off") || !strings.Contains(lines[1], "is not searchable by the spaces' uids") {
		t.Fatalf("dev's banner does not start with why the demo space is not isolated:\n%s", strings.Join(d.banner, "\n"))
	}
}
