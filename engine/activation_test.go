package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/internal/testwait"
	"github.com/lchat/lchat-caddy/sandbox"
	"github.com/lchat/lchat-caddy/spacestore/pageread/pagereadtest"
)

// activationEngine is an engine over a file bucket whose kinds are given; the state dir
// is short (socket paths) and removed at the end.
func activationEngine(t *testing.T, dir string, kinds map[string]Kind) *Engine {
	t.Helper()
	if _, err := sandbox.CheckPIDNamespace(); err != nil {
		t.Skipf("no PID namespaces here: %v", err)
	}
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if dir == "" {
		dir, err = os.MkdirTemp("", "act")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	cfg := Config{Bucket: b, StateDir: filepath.Join(dir, "state"), Holder: "box", Incarnation: "1", Kinds: kinds}
	for _, k := range kinds {
		if k.Isolation != IsolationNone {
			cfg.PageReader = pagereadtest.Binary(t) // an isolated space's checkpoints need it
		}
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	drainAtEnd(t, e)
	return e
}

// testKind is the test instance (this binary, see TestMain) under socket activation.
func testKind(t *testing.T, env map[string]string) Kind {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e := map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"}
	for k, v := range env {
		e[k] = v
	}
	return Kind{Command: self, Env: e, Replication: Replication{Class: ReplicateSleep}, StopGrace: 5 * time.Second,
		Isolation: IsolationNone, SocketActivation: true}
}

// rawGet sends one GET on one new connection to the socket and reads the answer: no
// retry, no second connection.
func rawGet(t *testing.T, socket, path string, timeout time.Duration) (int, string, error) {
	c, err := net.DialTimeout("unix", socket, timeout)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: instance\r\nConnection: close\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}

type instanceInfo struct {
	PID           int    `json:"pid"`
	UID           int    `json:"uid"`
	ListenPID     string `json:"listen_pid"`
	ListenFDs     string `json:"listen_fds"`
	ListenFDNames string `json:"listen_fdnames"`
	LchatSocket   string `json:"lchat_socket"`
	Requests      int    `json:"requests"`
}

func info(t *testing.T, socket string) instanceInfo {
	t.Helper()
	code, body, err := rawGet(t, socket, "/info", 10*time.Second)
	if err != nil || code != 200 {
		t.Fatalf("GET /info: %d %q %v", code, body, err)
	}
	var in instanceInfo
	if err := json.Unmarshal([]byte(body), &in); err != nil {
		t.Fatalf("GET /info: %q: %v", body, err)
	}
	return in
}

// TestSocketActivatedWakeAnswersTheQueuedFirstRequest: the wake returns at the exec,
// before the app even listens (it sleeps 400 ms first); the one request sent then waits
// in the kernel's queue and is answered once the app accepts, on its first and only
// connection. The app sees the systemd contract and no LCHAT_SOCKET; the socket file is
// the box's, in the proxy directory.
func TestSocketActivatedWakeAnswersTheQueuedFirstRequest(t *testing.T) {
	const delay = 400 * time.Millisecond
	e := activationEngine(t, "", map[string]Kind{"app": testKind(t, map[string]string{"START_DELAY_MS": "400"})})
	sp := Space{Host: "act.test", Kind: "app"}
	start := time.Now()
	u, err := e.Acquire(context.Background(), sp)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Release()
	if d := time.Since(start); d >= delay {
		t.Fatalf("the wake took %v: it waited for the app (started after %v) instead of proxying at once", d, delay)
	}
	code, body, err := rawGet(t, u.Socket(), "/info", 10*time.Second)
	if err != nil || code != 200 {
		t.Fatalf("first request: %d %q %v (refused or dropped while the app started)", code, body, err)
	}
	if d := time.Since(start); d < delay {
		t.Fatalf("answered after %v, before the app listened: not the instance", d)
	}
	var first instanceInfo
	json.Unmarshal([]byte(body), &first)
	if first.Requests != 1 {
		t.Errorf("the app saw %d requests for the first one: retried", first.Requests)
	}
	if first.PID != 1 || first.ListenPID != "1" || first.ListenFDs != "1" || first.ListenFDNames != "http" || first.LchatSocket != "" {
		t.Errorf("instance sees %+v; want pid 1 = LISTEN_PID, LISTEN_FDS=1, LISTEN_FDNAMES=http, no LCHAT_SOCKET", first)
	}
	fi, err := os.Lstat(u.Socket())
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode()&os.ModeSocket == 0 || int(st.Uid) != os.Geteuid() || fi.Mode().Perm() != 0o600 || filepath.Base(filepath.Dir(u.Socket())) != "proxy" {
		t.Errorf("socket %s: mode %v owner %d; want the box's 0600 socket in proxy/", u.Socket(), fi.Mode(), st.Uid)
	}
}

// TestSocketActivatedAppIgnoringItsSocketIsAFailedWake: an app that runs but never accepts
// on fd 3 is killed at ready_timeout; the request waiting on it ends, the space is
// asleep with the reason, and it counts as a crash.
func TestSocketActivatedAppIgnoringItsSocketIsAFailedWake(t *testing.T) {
	k := testKind(t, map[string]string{"IGNORE_FD": "1"})
	k.ReadyTimeout = 300 * time.Millisecond
	e := activationEngine(t, "", map[string]Kind{"app": k})
	sp := Space{Host: "ignore.test", Kind: "app"}
	u, err := e.Acquire(context.Background(), sp)
	if err != nil {
		t.Fatal(err)
	}
	if code, _, err := rawGet(t, u.Socket(), "/", 10*time.Second); err == nil {
		t.Fatalf("an app that never accepts answered %d", code)
	}
	u.Release()
	testwait.WaitFor(t, 10*time.Second, "the crash recorded", func() bool {
		st := e.Status()
		return len(st) == 1 && st[0].State == StateAsleep && strings.Contains(st[0].LastCrash, "never answered on the socket passed to it")
	})
	if c := e.Counters().Crashes; c != 1 {
		t.Errorf("crashes = %d, want 1", c)
	}
}

// TestSocketActivatedAppExitingBeforeItsAnswerIsAFailedWake: the request is not answered
// and the exit is a crash naming the first answer. The exit may come before the wake
// ends (its lease and fence are written while the app starts): the crash is handled right
// after the wake, and the request gets the crash's retry instead of a socket.
func TestSocketActivatedAppExitingBeforeItsAnswerIsAFailedWake(t *testing.T) {
	e := activationEngine(t, "", map[string]Kind{"app": testKind(t, map[string]string{"EXIT_AT_START": "4"})})
	u, err := e.Acquire(context.Background(), Space{Host: "exit.test", Kind: "app"})
	var re *RetryError
	switch {
	case errors.As(err, &re):
	case err != nil:
		t.Fatal(err)
	default:
		if code, _, err := rawGet(t, u.Socket(), "/", 10*time.Second); err == nil {
			t.Fatalf("an app that exited answered %d", code)
		}
		u.Release()
	}
	testwait.WaitFor(t, 10*time.Second, "the crash recorded", func() bool {
		st := e.Status()
		return len(st) == 1 && st[0].State == StateAsleep && strings.Contains(st[0].LastCrash, "exited before its first answer") &&
			strings.Contains(st[0].LastCrash, "exit status 4")
	})
}

// TestPID1StopHonoursItsSignalHandler: pid 1 of a namespace drops a SIGTERM it has no
// handler for, so the stop kills at once instead of waiting out stop_grace; one with a
// handler gets the signal and its grace.
func TestPID1StopHonoursItsSignalHandler(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	mark := filepath.Join(t.TempDir(), "term")
	const grace = 800 * time.Millisecond
	kinds := map[string]Kind{
		// No handler: sleep as pid 1 would ignore SIGTERM for ever.
		"plain": {Command: "/bin/sh", Args: []string{"-c", "exec sleep 1000"}, StopGrace: 10 * time.Second,
			Isolation: IsolationNone, SocketActivation: true, Replication: Replication{Class: ReplicateSleep}},
		// A handler that notes the signal and keeps running: the grace, then the kill.
		"trap": {Command: "/bin/sh", Args: []string{"-c", `trap 'echo term > "$MARK"' TERM; while :; do sleep 0.05; done`},
			Env: map[string]string{"MARK": mark}, StopGrace: grace,
			Isolation: IsolationNone, SocketActivation: true, Replication: Replication{Class: ReplicateSleep}},
	}
	e := activationEngine(t, "", kinds)
	ctx := context.Background()
	stop := func(host, kind string) time.Duration {
		u, err := e.Acquire(ctx, Space{Host: host, Kind: kind})
		if err != nil {
			t.Fatal(err)
		}
		u.Release()
		time.Sleep(200 * time.Millisecond) // the shell sets its trap
		start := time.Now()
		if err := e.Sleep(ctx, host); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	if d := stop("plain.test", "plain"); d > 2*time.Second {
		t.Errorf("stop of a pid 1 without a SIGTERM handler took %v: it waited out stop_grace (10s)", d)
	}
	d := stop("trap.test", "trap")
	if d < grace || d > grace+3*time.Second {
		t.Errorf("stop of a pid 1 with a SIGTERM handler took %v, want its grace %v", d, grace)
	}
	if b, err := os.ReadFile(mark); err != nil || strings.TrimSpace(string(b)) != "term" {
		t.Errorf("the handler never ran: %q %v", b, err)
	}
}

// TestSocketActivationKeepsIsolation: an isolated socket-activated instance runs under its
// space's uid in its space's cgroup, while the socket it was passed is the box's file.
func TestSocketActivationKeepsIsolation(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	dir, instBin := reachableInstance(t, "actiso")
	k := testKind(t, nil)
	k.Command, k.Isolation = instBin, IsolationOn
	e := activationEngine(t, dir, map[string]Kind{"app": k})
	u, err := e.Acquire(context.Background(), Space{Host: "iso.test", Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Release()
	got := info(t, u.Socket())
	if got.UID == 0 || got.UID == os.Geteuid() || got.PID != 1 {
		t.Errorf("isolated socket-activated instance: uid %d pid %d; want the space's uid as pid 1", got.UID, got.PID)
	}
	var pid int
	for _, st := range e.Status() {
		pid = st.PID
	}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil || !strings.Contains(string(cg), "/iso.test") {
		t.Errorf("instance %d cgroups %q (%v): want the space's group", pid, cg, err)
	}
	fi, err := os.Lstat(u.Socket())
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Geteuid() {
		t.Errorf("socket owned by %d, want the box (%d)", uid, os.Geteuid())
	}
}

// TestWithoutSocketActivationTheInstanceBindsItsSocket: a kind that does not opt in keeps
// today's contract: $LCHAT_SOCKET to bind, no passed listener, not pid 1.
func TestWithoutSocketActivationTheInstanceBindsItsSocket(t *testing.T) {
	k := testKind(t, nil)
	k.SocketActivation = false
	e := activationEngine(t, "", map[string]Kind{"app": k})
	u, err := e.Acquire(context.Background(), Space{Host: "plain.test", Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Release()
	got := info(t, u.Socket())
	if got.PID == 1 || got.ListenFDs != "" || got.ListenPID != "" || got.LchatSocket == "" {
		t.Errorf("instance sees %+v; want its own socket path and no activation", got)
	}
}
