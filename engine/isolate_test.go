package engine

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

// TestIsolatedSpaceOwnsItsDataAcrossSleeps runs a space under its own uid through a wake,
// a write, a sleep (checkpoint as the box) and a second wake (restore, handed back to
// the space's uid, which can write again).
func TestIsolatedSpaceOwnsItsDataAcrossSleeps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	dir, err := os.MkdirTemp("", "iso")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o711)
	bin, _ := os.ReadFile(os.Args[0])
	inst := filepath.Join(dir, "inst")
	if err := os.WriteFile(inst, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	kind := Kind{
		Command:     inst,
		Env:         map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
		Replication: Replication{Class: ReplicateSleep},
		StopGrace:   5 * time.Second,
		Isolation:   IsolationOn,
		Limits:      Limits{Pids: 100},
	}
	e, err := New(Config{Bucket: b, StateDir: filepath.Join(dir, "state"), Holder: "box", Incarnation: "1",
		Kinds: map[string]Kind{"app": kind}, UIDFirst: 3200000, UIDCount: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		e.Drain(ctx)
		e.Close()
	})
	const host = "iso.example.com"
	sp := Space{Host: host, Kind: "app"}
	post := func() {
		t.Helper()
		u, err := e.Acquire(context.Background(), sp)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Release()
		c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", u.Socket())
		}}}
		resp, err := c.Post("http://x/note", "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("instance answered %d writing its data dir", resp.StatusCode)
		}
	}
	post()
	var pid int
	for _, s := range e.Status() {
		pid = s.PID
	}
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	var uid string
	for l := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			uid = strings.Fields(v)[0]
		}
	}
	if n, _ := strconv.Atoi(uid); n < 3200000 || n >= 3200100 {
		t.Fatalf("instance runs as uid %q, want one from 3200000+100", uid)
	}
	if err := e.Sleep(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	post() // restored by the box, handed back to the space
	data := filepath.Join(dir, "state", "spaces", host, "data")
	notes, err := os.ReadFile(filepath.Join(data, "notes.txt"))
	if err != nil || strings.Count(string(notes), "/note") != 2 {
		t.Fatalf("notes after a sleep and a wake: %q %v", notes, err)
	}
	fi, _ := os.Stat(filepath.Join(data, "notes.txt"))
	if got := strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Uid)); got != uid {
		t.Fatalf("restored file owned by %s, want the space's uid %s", got, uid)
	}
}

func TestKindIsolationRefusals(t *testing.T) {
	if err := checkIsolation(Kind{Isolation: "maybe"}); err == nil || !strings.Contains(err.Error(), "unknown isolation") {
		t.Fatalf("isolation maybe: %v", err)
	}
	if err := checkIsolation(Kind{Limits: Limits{Pids: -1}}); err == nil {
		t.Fatal("a negative limit was accepted")
	}
	if os.Geteuid() != 0 {
		err := checkIsolation(Kind{Isolation: IsolationOn})
		if err == nil || !strings.Contains(err.Error(), "CAP_SETUID") {
			t.Fatalf("isolation on without capabilities: %v, want CAP_SETUID named", err)
		}
	}
}
