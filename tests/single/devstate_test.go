package single

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestDevKeepsStateOutOfTheCheckout: `lchat-caddy dev` without --dir writes nothing in the
// directory it runs in: its bucket, registry and instances live in lchat-dev under Caddy's
// data directory, which it prints, with the console's URL.
func TestDevKeepsStateOutOfTheCheckout(t *testing.T) {
	cwd := t.TempDir()
	home, err := os.MkdirTemp("", "dv") // short: instance sockets live under it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	listen := harness.FreeAddr(t, "127.0.0.1")
	cmd := exec.Command(harness.Binary(t), "dev", "--listen", listen, "--admin", harness.FreeAddr(t, "127.0.0.1"))
	cmd.Dir = cwd
	cmd.Env = []string{"HOME=" + home, "XDG_DATA_HOME=" + filepath.Join(home, "data"), "XDG_CONFIG_HOME=" + filepath.Join(home, "config"), "PATH=" + os.Getenv("PATH")}
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		cmd.Wait()
		close(done)
	}()
	defer func() {
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
		}
	}()
	var printed []string
	deadline := time.After(60 * time.Second)
	for !strings.Contains(strings.Join(printed, "\n"), "admin API:") {
		select {
		case l := <-lines:
			printed = append(printed, l)
		case <-done:
			t.Fatalf("dev exited:\n%s\n%s", strings.Join(printed, "\n"), stderr.String())
		case <-deadline:
			t.Fatalf("dev printed no URLs:\n%s", strings.Join(printed, "\n"))
		}
	}
	out := strings.Join(printed, "\n")
	state := filepath.Join(home, "data", "caddy", "lchat-dev")
	if !strings.Contains(out, "state in "+state) {
		t.Errorf("dev did not say its state is in %s:\n%s", state, out)
	}
	if !strings.Contains(out, "http://console.localhost:") {
		t.Errorf("dev did not print the console URL:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(state, "registry.db")); err != nil {
		t.Errorf("no registry in %s: %v", state, err)
	}
	if entries, _ := os.ReadDir(cwd); len(entries) != 0 {
		t.Errorf("dev wrote into the directory it runs in: %v", entries)
	}
}
