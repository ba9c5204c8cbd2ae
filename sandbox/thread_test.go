package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func init() {
	// Locked in init, the main goroutine runs on the main thread (runtime.LockOSThread).
	if os.Getenv("SANDBOX_TEST_MODE") == "mainthread" {
		runtime.LockOSThread()
	}
}

// mainThreadProbe runs on the main thread: it hands a private /tmp to offMainThread, as
// a forking goroutine that landed on the main thread would, and prints the tid that ran
// it and whether the main thread's view (/proc/self) sees the bind once it has run.
func mainThreadProbe() {
	dir := os.Getenv("SANDBOX_PROBE")
	done := make(chan int, 1)
	offMainThread(func() {
		if err := enterPrivateTmp(dir); err != nil {
			fmt.Println("error", err)
		}
		done <- unix.Gettid()
	})
	tid := <-done
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	fmt.Printf("pid %d tid %d main-sees-bind %v\n", unix.Getpid(), tid, strings.Contains(string(mi), dir))
	os.Exit(0)
}

// TestMainThreadNeverEntersANamespace: a forking goroutine on the main thread moves to
// another thread before it changes anything, so the main thread (which the runtime can
// never end) keeps the box's namespaces.
func TestMainThreadNeverEntersANamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "SANDBOX_TEST_MODE=mainthread", "SANDBOX_PROBE="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var pid, tid int
	var sees bool
	if _, err := fmt.Sscanf(string(out), "pid %d tid %d main-sees-bind %v", &pid, &tid, &sees); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if tid == pid || sees {
		t.Errorf("the private /tmp was entered on the main thread (pid %d, tid %d, main thread sees it: %v)", pid, tid, sees)
	}
}
