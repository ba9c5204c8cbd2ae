package deploycheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// repoRoot is the lchat-caddy repository this module sits in.
var repoRoot = func() string {
	abs, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return abs
}()

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// lchatCaddy is the lchat-caddy binary that adapts the box's Caddyfile: the one scripts/test
// built ($LCHAT_TEST_BIN with LCHAT_TEST_NO_BUILD=1, as the tests under tests/ take it), or
// one built from this checkout.
func lchatCaddy(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if dir := os.Getenv("LCHAT_TEST_BIN"); dir != "" && os.Getenv("LCHAT_TEST_NO_BUILD") == "1" {
			binPath = filepath.Join(dir, "lchat-caddy")
			if _, err := os.Stat(binPath); err != nil {
				buildErr = fmt.Errorf("LCHAT_TEST_NO_BUILD=1 and no %s: %v", binPath, err)
			}
			return
		}
		dir, err := os.MkdirTemp("", "deploycheck")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "lchat-caddy")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/lchat-caddy")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building lchat-caddy: %v: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" && os.Getenv("LCHAT_TEST_NO_BUILD") != "1" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}
