package demospace

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestMain lets the test binary act as lchat-demo-space, so the command tests
// run Main, the command both binaries share, in a real process.
func TestMain(m *testing.M) {
	if os.Getenv("DEMOSPACE_TEST_MAIN") == "1" {
		args := strings.Fields(os.Getenv("DEMOSPACE_TEST_ARGS"))
		if len(args) > 0 && args[0] == "demo-space" {
			args = args[1:]
		}
		if err := Main(args, os.Stderr, zap.NewNop()); err != nil {
			fmt.Fprintln(os.Stderr, "demo-space:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func startCommand(t *testing.T, env []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "DEMOSPACE_TEST_MAIN=1", "DEMOSPACE_TEST_ARGS="+strings.Join(append([]string{"demo-space"}, args...), " "))
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}

// waitReady polls until the process answers on its socket: the readiness
// check the proxy performs, not a timing assertion.
func waitReady(t *testing.T, sock string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo-space did not listen on %s: %v", sock, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitExit(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(30 * time.Second):
		t.Fatal("demo-space did not exit after the signal")
		return -1
	}
}

func TestCommandRunsFromEnvAndStopsCleanlyOnSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			sock := filepath.Join(shortTempDir(t), "s.sock")
			dataDir := t.TempDir()
			cmd := startCommand(t, []string{"LCHAT_SOCKET=" + sock, "LCHAT_DATA_DIR=" + dataDir, "LCHAT_HOST=env-host.example.com"})
			waitReady(t, sock)

			s := &space{t: t, sock: sock, client: unixClient(sock)}
			if code, body := s.do("GET", "/", "", ""); code != 200 || !strings.Contains(body, "env-host.example.com") {
				t.Fatalf("GET / = %d, want the page showing LCHAT_HOST", code)
			}
			s.postMessage("ada", "kept across restarts")
			s.client.CloseIdleConnections()

			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if code := waitExit(t, cmd); code != 0 {
				t.Fatalf("exit code after %v = %d, want 0", sig, code)
			}
			if _, err := os.Stat(filepath.Join(dataDir, DBFile+"-wal")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("database not closed cleanly: %v", err)
			}

			// Flags override the environment; the data survived the stop.
			cmd = startCommand(t, []string{"LCHAT_SOCKET=/nonexistent/x.sock", "LCHAT_HOST=env-host.example.com"},
				"--socket", sock, "--data-dir", dataDir, "--host", "flag-host.example.com")
			waitReady(t, sock)
			s.client = unixClient(sock)
			if code, body := s.do("GET", "/", "", ""); code != 200 || !strings.Contains(body, "flag-host.example.com") ||
				!strings.Contains(body, "kept across restarts") {
				t.Fatalf("GET / after restart with flags = %d, want the --host name and the old message", code)
			}
			s.client.CloseIdleConnections()
			cmd.Process.Signal(syscall.SIGTERM)
			if code := waitExit(t, cmd); code != 0 {
				t.Fatalf("exit code = %d, want 0", code)
			}
		})
	}
}

func TestCommandRefusesMissingSettings(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "DEMOSPACE_TEST_MAIN=1", "DEMOSPACE_TEST_ARGS=demo-space", "LCHAT_SOCKET=", "LCHAT_DATA_DIR=")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("demo-space without a socket: %v, want a failing exit", err)
	}
	if !strings.Contains(string(out), "LCHAT_SOCKET") {
		t.Fatalf("output %q does not say what is missing", out)
	}
}
