// Package harness starts the real parts the tests run against: a versitygw S3 server,
// lchat-caddy processes, and the other servers built from tools/go.mod. Every helper
// registers its own cleanup with t.Cleanup, so a test gets a working part with one call.
package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// RepoRoot is the checkout this harness belongs to.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// binDir holds the binaries the harness builds; shared by every test process of one run
// (and across runs) so each binary is built once.
func binDir() string {
	if d := os.Getenv("LCHAT_TEST_BIN"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "bin")
}

var (
	buildMu   sync.Mutex
	buildDone = map[string]error{}
)

// build runs `go build` once per process for one binary, with the Go build cache
// making repeat builds cheap. modfile selects tools/go.mod for the test servers.
func build(name, pkg, modfile string) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	out := filepath.Join(binDir(), name)
	if err, ok := buildDone[name]; ok {
		return out, err
	}
	if os.Getenv("LCHAT_TEST_NO_BUILD") != "" {
		if _, err := os.Stat(out); err == nil {
			buildDone[name] = nil
			return out, nil
		}
	}
	args := []string{"build", "-o", out}
	dir := RepoRoot()
	if modfile != "" {
		dir = filepath.Join(RepoRoot(), "tools")
	}
	args = append(args, pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	output, err := cmd.CombinedOutput()
	if err != nil {
		err = fmt.Errorf("building %s: %v\n%s", name, err, output)
	}
	buildDone[name] = err
	return out, err
}

// Binary returns the path of a freshly built lchat-caddy.
func Binary(t testing.TB) string {
	t.Helper()
	p, err := build("lchat-caddy", "./cmd/lchat-caddy", "")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Tool returns the path of a test server built from tools/go.mod: "versitygw",
// "pebble", "pebble-challtestsrv" or "xcaddy".
func Tool(t testing.TB, name string) string {
	t.Helper()
	pkgs := map[string]string{
		"versitygw":           "github.com/versity/versitygw/cmd/versitygw",
		"pebble":              "github.com/letsencrypt/pebble/v2/cmd/pebble",
		"pebble-challtestsrv": "github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv",
		"xcaddy":              "github.com/caddyserver/xcaddy/cmd/xcaddy",
	}
	pkg, ok := pkgs[name]
	if !ok {
		t.Fatalf("unknown tool %q", name)
	}
	p, err := build(name, pkg, "tools/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	return p
}
