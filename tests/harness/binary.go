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
	"syscall"
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
// making repeat builds cheap. modfile selects tools/go.mod for the test servers. static
// builds without cgo (CGO_ENABLED=0, as scripts/test builds the programs a box execs at
// each wake or checkpoint): a statically linked binary does not run the dynamic loader at
// every exec.
func build(name, pkg, modfile string, static bool) (string, error) {
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
	err := buildLocked(out, pkg, modfile, static)
	buildDone[name] = err
	return out, err
}

// buildLocked builds pkg into out under a file lock shared by every test process, writing a
// temp file and renaming it so a concurrent reader never sees a half-written binary.
func buildLocked(out, pkg, modfile string, static bool) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(out), ".build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	dir := RepoRoot()
	if modfile != "" {
		dir = filepath.Join(RepoRoot(), filepath.Dir(modfile))
	}
	tmp := fmt.Sprintf("%s.tmp%d", out, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, pkg)
	cmd.Dir = dir
	if static {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	}
	if output, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("building %s: %v\n%s", pkg, err, output)
	}
	return os.Rename(tmp, out)
}

// Binary returns the path of a freshly built lchat-caddy, with lchat-pageread beside it
// (an isolated space's checkpoints read its databases with it).
func Binary(t testing.TB) string {
	t.Helper()
	PageReader(t)
	// With cgo: os/user then asks NSS, so an LDAP or systemd account's uid is never
	// handed to a space (sandbox.accountExists).
	p, err := build("lchat-caddy", "./cmd/lchat-caddy", "", false)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// PageReader returns the path of a freshly built lchat-pageread, in the directory every
// lchat-caddy the harness builds is in.
func PageReader(t testing.TB) string {
	t.Helper()
	p, err := build("lchat-pageread", "./cmd/lchat-pageread", "", true)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// CertsBinary returns the path of lchat-caddy built with the test-only DNS provider
// dns.providers.lchat_challtestsrv (tests/certs/cmd), for configs that obtain
// certificates from pebble by DNS-01 (LCHAT_DNS_PROVIDER=lchat_challtestsrv).
// scripts/test does not prebuild it, so it is always built (once per test process; the
// Go build cache makes that cheap), never taken stale from an earlier run.
func CertsBinary(t testing.TB) string {
	t.Helper()
	PageReader(t)
	const name = "lchat-caddy-certs"
	buildMu.Lock()
	defer buildMu.Unlock()
	out := filepath.Join(binDir(), name)
	err, ok := buildDone[name]
	if !ok {
		err = buildLocked(out, "./tests/certs/cmd", "", false)
		buildDone[name] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
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
	p, err := build(name, pkg, "tools/go.mod", false)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// DemoSpaceBinary returns the path of the demo space's own small binary
// (cmd/lchat-demo-space), which scripts/test builds beside lchat-caddy.
func DemoSpaceBinary(t testing.TB) string {
	t.Helper()
	p, err := build("lchat-demo-space", "./cmd/lchat-demo-space", "", true)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Program returns the path of a small test program built from pkg (a path below the
// repository, "./tests/..."), named name in the binaries' directory, without cgo like the
// demo space it is measured against.
func Program(t testing.TB, name, pkg string) string {
	t.Helper()
	return program(t, name, pkg, true)
}

// ProgramWithCgo is Program built with cgo (dynamically linked, go build's default), for
// a figure that sets the two side by side.
func ProgramWithCgo(t testing.TB, name, pkg string) string {
	t.Helper()
	return program(t, name, pkg, false)
}

func program(t testing.TB, name, pkg string, static bool) string {
	t.Helper()
	p, err := build(name, pkg, "", static)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
