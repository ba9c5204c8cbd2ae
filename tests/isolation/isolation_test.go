// Package isolation proves, with real lchat-caddy processes run as root (as CI runs),
// that a space's instance cannot reach another space, the box's secrets or
// certificates, or the admin API; that a stop ends every process of a space; that a
// memory limit kills a hog and the space wakes again; that instance logs stay capped;
// and that a short mesh token is refused.
package isolation

import (
	"context"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/internal/testnet"
	"github.com/lchat/lchat-caddy/tests/harness"
)

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the isolation tests switch uids: run as root (CI does)")
	}
}

const isoCaddyfile = `{
	admin {$LCHAT_ADMIN_LISTEN}
	http_port {$HTTP_PORT}
	https_port {$HTTPS_PORT}
	auto_https disable_redirects
	skip_install_trust
	storage file_system {$DIR}/state/caddy
	lchat {
		bucket file {$DIR}/bucket
		state_dir {$DIR}/state/spaces
		registry {$DIR}/state/registry.db
		uid_range 3100000 10000
		instance_log {
			max_size 1MiB
			keep 2
		}
		kind attack {
			command {$ATTACKER}
			isolation on
			ready_path /healthz
			idle_timeout 10m
			stop_grace 2s
			replication sleep
		}
		kind escape {
			command {$ATTACKER}
			isolation on
			ready_path /healthz
			idle_timeout 2s
			stop_grace 2s
			replication sleep
		}
		kind disk {
			command {$ATTACKER}
			isolation on
			ready_path /healthz
			stop_grace 2s
			replication sleep
			limits {
				disk 32MiB
			}
		}
		kind hog {
			command {$ATTACKER}
			isolation on
			ready_path /healthz
			stop_grace 2s
			replication sleep
			limits {
				memory 64MiB
				pids 64
			}
		}
	}
}

http:// {
	lchat
}

https://certs.localhost {
	tls internal
	respond "certs"
}
`

// startIsoBox runs the box in a network namespace of its own: its kinds are isolated,
// so their network is egress, and the box's nftables table must not land in the
// machine's own network.
func startIsoBox(t *testing.T) *box {
	b := restartIsoBox(t, "")
	for host, kind := range map[string]string{"a.localhost": "attack", "b.localhost": "attack", "e.localhost": "escape", "h.localhost": "hog", "d.localhost": "disk"} {
		b.mustAdmin("POST", "/lchat/routes", map[string]any{"host": host, "kind": kind, "hibernate": true}, nil)
	}
	return b
}

// restartIsoBox starts an isolation box in dir, where one ran before ("": a new box).
func restartIsoBox(t *testing.T, dir string) *box {
	return startBoxWith(t, boxOptions{ns: testnet.New(t, "iso"), dir: dir}, isoCaddyfile, "ATTACKER="+attackerBinary(t))
}

func wake(t *testing.T, b *box, host string) {
	t.Helper()
	st, body, err := b.space("GET", host, "/healthz")
	if err != nil || st != 200 {
		t.Fatalf("waking %s: %d %v %s", host, st, err, body)
	}
}

// whoami parses the instance's /proc/self/status lines.
func whoami(t *testing.T, b *box, host string) map[string]string {
	t.Helper()
	a := b.try(host, "whoami", nil)
	out := map[string]string{}
	for l := range strings.SplitSeq(a.Out, "\n") {
		k, v, _ := strings.Cut(l, ":")
		out[k] = strings.TrimSpace(v)
	}
	return out
}

func TestInstanceCannotReachOtherSpacesOrTheBox(t *testing.T) {
	needRoot(t)
	b := startIsoBox(t)
	wake(t, b, "a.localhost")
	wake(t, b, "b.localhost")

	spaces := filepath.Join(b.dir, "state", "spaces", "spaces")
	aData, bData := filepath.Join(spaces, "a.localhost", "data"), filepath.Join(spaces, "b.localhost", "data")

	// Who the instances are: two different unprivileged uids, no groups, no capabilities.
	wa, wb := whoami(t, b, "a.localhost"), whoami(t, b, "b.localhost")
	uidA, uidB := strings.Fields(wa["Uid"])[0], strings.Fields(wb["Uid"])[0]
	if uidA == "0" || uidB == "0" || uidA == uidB {
		t.Errorf("instance uids a=%s b=%s: want two distinct non-root uids", uidA, uidB)
	}
	for _, w := range []map[string]string{wa, wb} {
		for _, c := range []string{"CapInh", "CapPrm", "CapEff", "CapAmb"} {
			if w[c] != "0000000000000000" {
				t.Errorf("instance %s = %s, want no capabilities", c, w[c])
			}
		}
		if w["Groups"] != "" {
			t.Errorf("instance groups %q, want none", w["Groups"])
		}
	}
	// Data dir and socket dir belong to the space, 0700.
	for dir, uid := range map[string]string{aData: uidA, bData: uidB} {
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if strconv.Itoa(int(st.Uid)) != uid || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: owner %d mode %v, want %s 0700", dir, st.Uid, fi.Mode().Perm(), uid)
		}
	}

	// B keeps a secret in its data dir; A's own file is the control that reads work.
	if a := b.try("b.localhost", "write", url.Values{"path": {filepath.Join(bData, "secret")}}); !a.OK {
		t.Fatalf("B writing its own data dir: %s", a.Err)
	}
	if a := b.try("a.localhost", "write", url.Values{"path": {filepath.Join(aData, "mine")}}); !a.OK {
		t.Fatalf("A writing its own data dir: %s", a.Err)
	}
	if a := b.try("a.localhost", "read", url.Values{"path": {filepath.Join(aData, "mine")}}); !a.OK || a.Out != "written by a.localhost" {
		t.Fatalf("control: A reading its own file: %+v", a)
	}

	// The certificate keys the box holds: wait for the internal CA and the site's key.
	var keys []string
	harness.WaitFor(t, 60*time.Second, "certificate keys on disk", func() bool {
		keys = nil
		filepath.WalkDir(filepath.Join(b.dir, "state", "caddy"), func(p string, d fs.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(p, ".key") {
				keys = append(keys, p)
			}
			return nil
		})
		return len(keys) >= 2
	})

	denied := map[string]string{
		"B's data dir":             bData,
		"B's secret":               filepath.Join(bData, "secret"),
		"B's instance log":         filepath.Join(spaces, "b.localhost", "instance.log"),
		"registry.db":              filepath.Join(b.dir, "state", "registry.db"),
		"certificate storage":      filepath.Join(b.dir, "state", "caddy"),
		"uid allocations":          filepath.Join(b.dir, "state", "spaces", "uids.json"),
		"the spaces' directory":    spaces,
		"the proxy's socket links": filepath.Join(b.dir, "state", "spaces", "proxy"),
		"the box's environment":    "/proc/" + strconv.Itoa(b.cmd.Process.Pid) + "/environ",
		"the box's descriptors":    "/proc/" + strconv.Itoa(b.cmd.Process.Pid) + "/fd",
	}
	for _, k := range keys {
		denied["key "+strings.TrimPrefix(k, b.dir)] = k
	}
	for what, p := range denied {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %s does not exist, so denying it proves nothing: %v", what, p, err)
		}
		// Never print what a successful read returned: it may be a key.
		if a := b.try("a.localhost", "read", url.Values{"path": {p}}); a.OK || !strings.Contains(a.Err, "permission denied") {
			t.Errorf("A reading %s (%s): ok=%v err=%q, want permission denied", what, p, a.OK, a.Err)
		}
	}
	for what, p := range map[string]string{"B's data dir": filepath.Join(bData, "planted"), "the spaces' directory": filepath.Join(spaces, "planted")} {
		if a := b.try("a.localhost", "write", url.Values{"path": {p}}); a.OK || !strings.Contains(a.Err, "permission denied") {
			t.Errorf("A writing into %s: %+v, want permission denied", what, a)
		}
	}

	// The admin API: a Unix socket, 0600, the box's.
	if a := b.try("a.localhost", "dial", url.Values{"path": {b.admin}}); a.OK || !strings.Contains(a.Err, "permission denied") {
		t.Errorf("A connecting to the admin socket: %+v, want permission denied", a)
	}
	bSock := filepath.Join(b.dir, "state", "spaces", "run")
	ents, _ := os.ReadDir(bSock)
	reached := 0
	for _, e := range ents {
		sock := filepath.Join(bSock, e.Name(), "s.sock")
		a := b.try("a.localhost", "dial", url.Values{"path": {sock}})
		if a.OK {
			reached++
		} else if !strings.Contains(a.Err, "permission denied") {
			t.Errorf("A dialing %s: %s, want permission denied", sock, a.Err)
		}
	}
	if len(ents) != 2 || reached != 1 {
		t.Errorf("A reached %d of %d instance sockets, want only its own", reached, len(ents))
	}

	// Signals: the box and B's instance are out of reach.
	bPID := b.status("b.localhost").PID
	if bPID == 0 {
		t.Fatal("no pid for b.localhost")
	}
	for what, pid := range map[string]int{"the box": b.cmd.Process.Pid, "B's instance": bPID} {
		for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM, syscall.SIGSTOP} {
			a := b.try("a.localhost", "signal", url.Values{"pid": {strconv.Itoa(pid)}, "sig": {strconv.Itoa(int(sig))}})
			if a.OK || !strings.Contains(a.Err, "operation not permitted") {
				t.Errorf("A sending %v to %s (%d): %+v, want operation not permitted", sig, what, pid, a)
			}
		}
	}
	if st, _, err := b.space("GET", "b.localhost", "/healthz"); err != nil || st != 200 {
		t.Errorf("B after A's attempts: %d %v", st, err)
	}
	if a := b.try("b.localhost", "read", url.Values{"path": {filepath.Join(bData, "secret")}}); !a.OK || a.Out != "written by b.localhost" {
		t.Errorf("B's secret after A's attempts: %+v", a)
	}
}

// TestControlEndpointRefusesAnotherSpacesInstance: each isolated instance runs as its own
// uid, and a space's control endpoint (the box's API for its held connections, on a
// socket any uid may connect to, at a path that is no secret) hangs up on a caller whose
// uid is not its instance's before reading a request. A's instance is answered on its own
// endpoint and refused on B's, which answers B's instance.
func TestControlEndpointRefusesAnotherSpacesInstance(t *testing.T) {
	needRoot(t)
	b := startIsoBox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return b.dial(ctx, network, b.httpAddr)
	}}}
	// A space's control endpoint is served from its first held connection.
	for _, host := range []string{"a.localhost", "b.localhost"} {
		c, _, err := websocket.Dial(ctx, "ws://"+host+"/hold", &websocket.DialOptions{HTTPClient: client})
		if err != nil {
			t.Fatalf("holding a WebSocket of %s: %v", host, err)
		}
		defer c.CloseNow()
	}
	bPath := engine.ControlSocketPath(filepath.Join(b.dir, "state", "spaces"), "b.localhost")
	own := url.Values{"path": {"$LCHAT_CONTROL_SOCKET"}}
	var a attempt
	harness.WaitFor(t, 30*time.Second, "A's and B's control endpoints answering their own instances", func() bool {
		a = b.try("a.localhost", "control", own)
		ab := b.try("b.localhost", "control", own)
		return a.OK && strings.HasPrefix(a.Out, "200 ") && ab.OK && strings.HasPrefix(ab.Out, "200 ")
	})
	// The path A tries is the one B's instance was given (and reached above).
	if env := b.try("b.localhost", "read", url.Values{"path": {"/proc/self/environ"}}); !strings.Contains(env.Out, "LCHAT_CONTROL_SOCKET="+bPath+"\x00") {
		t.Fatalf("B's instance was not given %s as its control socket; refusing A on it would prove nothing", bPath)
	}
	if got := b.try("a.localhost", "control", url.Values{"path": {bPath}}); got.OK {
		t.Errorf("A's instance on B's control endpoint: answered %.200q, want hung up on", got.Out)
	} else {
		t.Logf("A's instance on B's control endpoint: %s", got.Err)
	}
	if got := b.try("b.localhost", "control", own); !got.OK || !strings.HasPrefix(got.Out, "200 ") {
		t.Errorf("B's instance on its own endpoint after A's attempt: %+v", got)
	}
}

func TestStopEndsEscapedDescendants(t *testing.T) {
	needRoot(t)
	b := startIsoBox(t)
	wake(t, b, "e.localhost")
	a := b.try("e.localhost", "escape", nil)
	leaf, err := strconv.Atoi(a.Out)
	if !a.OK || err != nil {
		t.Fatalf("escape: %+v", a)
	}
	inst := b.status("e.localhost").PID
	if sid, _ := unix.Getsid(leaf); sid != leaf {
		t.Fatalf("the escaped process %d is not in its own session (sid %d)", leaf, sid)
	}
	if pgid, _ := unix.Getpgid(leaf); pgid == inst {
		t.Fatalf("the escaped process %d is still in the instance's process group", leaf)
	}
	if !alive(leaf) {
		t.Fatal("the escaped process is not running: the test proves nothing")
	}
	// The kind sleeps after 2s idle: the stop signal goes to the instance's process group,
	// which the escaped process left; the cgroup must end it anyway.
	harness.WaitFor(t, 60*time.Second, "e.localhost asleep", func() bool { return b.status("e.localhost").State == "asleep" })
	harness.WaitFor(t, 5*time.Second, "the escaped process ended", func() bool { return !alive(leaf) })
}

func TestMemoryHogKilledReportedAndWakesAgain(t *testing.T) {
	needRoot(t)
	b := startIsoBox(t)
	wake(t, b, "h.localhost")
	st, _, _ := b.space("POST", "h.localhost", "/hog")
	if st == 200 {
		t.Fatal("the hog answered: it was not killed")
	}
	harness.WaitFor(t, 60*time.Second, "the hog reported as an out-of-memory crash", func() bool {
		s := b.status("h.localhost")
		return s.State == "asleep" && strings.Contains(s.LastCrash, "out of memory")
	})
	var stt struct {
		Counters map[string]float64 `json:"counters"`
	}
	b.mustAdmin("GET", "/lchat/status", nil, &stt)
	if stt.Counters["oom_kills"] < 1 || stt.Counters["crashes"] < 1 {
		t.Errorf("counters %v: want oom_kills and crashes counted", stt.Counters)
	}
	if !strings.Contains(b.logs.String(), "out of memory") {
		t.Error("the box's log does not say the instance ran out of memory")
	}
	// The next request wakes the space again.
	wake(t, b, "h.localhost")
}

func TestInstanceLogStaysUnderItsCap(t *testing.T) {
	needRoot(t)
	b := startIsoBox(t)
	wake(t, b, "a.localhost")
	if a := b.try("a.localhost", "flood", url.Values{"mb": {"12"}}); !a.OK {
		t.Fatalf("flood: %+v", a)
	}
	dir := filepath.Join(b.dir, "state", "spaces", "spaces", "a.localhost")
	const capBytes, keep = 1 << 20, 2
	harness.WaitFor(t, 30*time.Second, "the log pump to catch up and old logs to be pruned", func() bool {
		files, _ := filepath.Glob(filepath.Join(dir, "instance*"))
		return len(files) <= keep+1
	})
	files, _ := filepath.Glob(filepath.Join(dir, "instance*"))
	var total int64
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > capBytes {
			t.Errorf("%s is %d bytes, over the 1 MiB cap", filepath.Base(f), fi.Size())
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", filepath.Base(f), fi.Mode().Perm())
		}
		total += fi.Size()
	}
	t.Logf("after a 12 MiB flood: %d files, %d bytes in all", len(files), total)
	if len(files) < 2 {
		t.Errorf("only %d log files after a 12 MiB flood with a 1 MiB cap: no rotation", len(files))
	}
}

func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(data), ')')
	return i < 0 || i+2 >= len(data) || (data[i+2] != 'Z' && data[i+2] != 'X')
}

// TestSocketSymlinkDoesNotRedirectTheProxy: an instance owns its socket directory, so it
// can replace its socket with a symlink to the admin socket. The box must keep proxying
// to the socket the instance bound, never follow the link with its own privileges
// (which would put the admin API on the space's public hostname).
func TestSocketSymlinkDoesNotRedirectTheProxy(t *testing.T) {
	needRoot(t)
	b := startIsoBox(t)
	wake(t, b, "a.localhost")
	if a := b.try("a.localhost", "hijack", url.Values{"target": {b.admin}}); !a.OK {
		t.Fatalf("hijack: %+v", a)
	}
	for i := range 5 {
		st, body, err := b.spaceClose("GET", "a.localhost", "/config/")
		if err != nil {
			t.Fatal(err)
		}
		if st != 200 || !strings.HasPrefix(string(body), "attacker a.localhost") {
			t.Fatalf("request %d after the socket became a symlink to the admin socket: %d %.200q, want the instance's own answer", i, st, body)
		}
	}
}
