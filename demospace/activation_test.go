package demospace

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/lchat/lchat-caddy/sandbox"
)

// passedListenerCommand starts the demo space with a listener the test bound passed as
// fd 3, in a PID namespace of its own so that LISTEN_PID (listenPID) can name it.
func passedListenerCommand(t *testing.T, sock, listenPID string) *exec.Cmd {
	t.Helper()
	ns, err := sandbox.CheckPIDNamespace()
	if err != nil {
		t.Skipf("no PID namespaces here: %v", err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	f, err := ln.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	t.Cleanup(func() { f.Close() }) // the test's copy; the child has its own
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "DEMOSPACE_TEST_MAIN=1", "DEMOSPACE_TEST_ARGS=demo-space",
		"LCHAT_SOCKET=", "LCHAT_DATA_DIR="+t.TempDir(), "LCHAT_HOST=passed.example.com",
		"LISTEN_FDS=1", "LISTEN_FDNAMES=http", "LISTEN_PID="+listenPID)
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	ns.Apply(cmd.SysProcAttr)
	return cmd
}

// TestCommandServesThePassedListener: under socket activation the demo space serves fd 3
// (no LCHAT_SOCKET set) and leaves the socket file, the box's, in place when it stops.
func TestCommandServesThePassedListener(t *testing.T) {
	sock := filepath.Join(shortTempDir(t), "s.sock")
	cmd := passedListenerCommand(t, sock, "1")
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
	s := &space{t: t, sock: sock, client: unixClient(sock)}
	if code, body := s.do("GET", "/", "", ""); code != 200 || !strings.Contains(body, "passed.example.com") {
		t.Fatalf("GET / on the passed listener = %d", code)
	}
	s.client.CloseIdleConnections()
	cmd.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, cmd); code != 0 {
		t.Fatalf("exit code = %d, want 0", code)
	}
	if _, err := os.Lstat(sock); errors.Is(err, fs.ErrNotExist) {
		t.Fatal("the demo space removed the socket file it was passed")
	}
}

// TestCommandRefusesAListenerForAnotherPID: LISTEN_PID names another process, so the
// descriptors are not this one's (sd_listen_fds(3)): refused, with why.
func TestCommandRefusesAListenerForAnotherPID(t *testing.T) {
	sock := filepath.Join(shortTempDir(t), "s.sock")
	cmd := passedListenerCommand(t, sock, "4242")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(string(out), "LISTEN_PID=4242 is not this process") {
		t.Fatalf("demo-space with another process's LISTEN_PID: %v %q", err, out)
	}
}
