// Package pagereadtest gives tests a real lchat-pageread: built from this checkout once per
// test process (or taken from $LCHAT_TEST_BIN when LCHAT_TEST_NO_BUILD is set, as
// scripts/test prebuilds it) and copied where every uid can execute it.
package pagereadtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	once  sync.Once
	built string
	err   error
)

// Binary returns the path of lchat-pageread in a directory the spaces' uids can traverse
// (0711; the file 0755). It lives for the whole test process.
func Binary(t testing.TB) string {
	t.Helper()
	once.Do(func() { built, err = build() })
	if err != nil {
		t.Fatal(err)
	}
	return built
}

func build() (string, error) {
	dir, err := os.MkdirTemp("", "pageread")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "lchat-pageread")
	if bin := os.Getenv("LCHAT_TEST_BIN"); bin != "" && os.Getenv("LCHAT_TEST_NO_BUILD") != "" {
		if b, err := os.ReadFile(filepath.Join(bin, "lchat-pageread")); err == nil {
			return out, os.WriteFile(out, b, 0o755)
		}
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/lchat-pageread")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // as scripts/test builds it
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building lchat-pageread: %v\n%s", err, b)
	}
	return out, os.Chmod(out, 0o755)
}
