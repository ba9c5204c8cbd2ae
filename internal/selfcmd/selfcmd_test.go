package selfcmd

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestGoRun(t *testing.T) {
	hash := strings.Repeat("94cf", 16)
	for _, c := range []struct {
		exe  string
		want bool
	}{
		{"/tmp/go-build1234/b001/exe/lchat-caddy", true},
		{"/root/.cache/go-build/94/" + hash + "-d/lchat-caddy", true}, // Go's cache: every go run after the first
		{"/tmp/gocache/94/" + hash + "-d/lchat-caddy", true},          // GOCACHE elsewhere
		{"/tmp/gocache/95/" + hash + "-d/lchat-caddy", false},         // not its shard
		{"/tmp/gocache/94/" + hash[:62] + "-d/lchat-caddy", false},    // not a hash
		{"/tmp/gocache/94/" + hash + "-a/lchat-caddy", false},         // not an executable entry
		{"/usr/local/bin/lchat-caddy", false},
		{"/work/bin/lchat-caddy", false},
	} {
		if got := GoRun(c.exe); got != c.want {
			t.Errorf("GoRun(%s) = %t, want %t", c.exe, got, c.want)
		}
	}
}

// What a person types after a go run: the command printed names `go run` and the
// package, both on the first run (a binary in a go-build temporary directory) and on the
// second (Go's cached binary), never the binary's path. Both runs share a build cache of
// their own, fresh as a new user's (GOCACHE), so the first run builds and the second is
// served from that cache.
func TestCommandUnderGoRunTwice(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, 8)
	rand.Read(nonce)
	cache := t.TempDir()
	// The binary's path, as os.Executable gives it, has no symbolic link in it.
	cacheDir, err := filepath.EvalSymlinks(cache)
	if err != nil {
		t.Fatal(err)
	}
	run := func() (printed, exe string) {
		// -buildvcs=false: a commit between the two runs must not make the second build again.
		cmd := exec.Command(gobin, "run", "-buildvcs=false", "-ldflags=-X main.nonce="+hex.EncodeToString(nonce), "./internal/selfcmd/testdata/printself")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOCACHE="+cache)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go run: %v\n%s", err, out)
		}
		lines := strings.Split(string(out), "\n")
		return lines[0], lines[1]
	}
	const want = "go run ./internal/selfcmd/testdata/printself"
	for i, what := range []string{"first", "second"} {
		printed, exe := run()
		t.Logf("%s go run: binary %s", what, exe)
		if printed != want {
			t.Errorf("%s go run printed %q (binary %s), want %q", what, printed, exe, want)
		}
		// Go caches go run's binaries (since Go 1.24; go.mod asks for a later one): the
		// second run is the cache's entry, the binary whose path the banner must not print.
		if i == 1 && !strings.HasPrefix(exe, cacheDir+string(filepath.Separator)) {
			t.Errorf("the second go run ran %s, not Go's cached binary under GOCACHE %s", exe, cacheDir)
		}
		if _, err := os.Stat(exe); i == 1 && err != nil {
			t.Errorf("the second go run's binary %s is gone: %v", exe, err)
		}
	}
}
