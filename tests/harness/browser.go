package harness

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/chromedp/chromedp"
)

// Browser starts Debian's headless Chromium (scripts/test installs it) under chromedp and
// returns a tab's context, closed when the test ends. A missing browser fails the test:
// the console's tests are what prove it works in a browser. extra adds options, e.g.
// chromedp.Flag("host-resolver-rules", "MAP console.test 127.0.0.1").
func Browser(t testing.TB, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	path := os.Getenv("LCHAT_CHROMIUM")
	if path == "" {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if p, err := exec.LookPath(name); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		t.Fatal("no chromium on PATH: scripts/test installs Debian's chromium (apt-get install chromium), or set LCHAT_CHROMIUM")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // tests run as root
		chromedp.WindowSize(1400, 1000),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("no-proxy-server", true),
	)
	opts = append(opts, extra...)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	// The first action starts the browser, bound to the context it runs with: ctx itself,
	// not a shorter-lived child.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	return ctx
}

// ArtifactDir is where a test keeps files for people to look at (screenshots):
// $LCHAT_ARTIFACTS/<test>, else tests/<pkg>/artifacts/<test> in the checkout
// (.gitignore covers it). It is emptied at the start of the test.
func ArtifactDir(t testing.TB, pkg string) string {
	t.Helper()
	base := os.Getenv("LCHAT_ARTIFACTS")
	if base == "" {
		base = filepath.Join(RepoRoot(), "tests", pkg, "artifacts")
	}
	dir := filepath.Join(base, regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(t.Name(), "_"))
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
