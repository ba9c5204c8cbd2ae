package engine

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/spacestore/pageread/pagereadtest"
)

// reachableInstance copies this test binary, the instance of the isolation tests, into a
// new directory the spaces' uids can traverse (0711; the file 0755), removed when the
// test ends. It returns the directory (for state dirs) and the copy.
func reachableInstance(t testing.TB, prefix string) (dir, inst string) {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o711)
	bin, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	inst = filepath.Join(dir, "inst")
	if err := os.WriteFile(inst, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, inst
}

// TestIsolatedSpaceOwnsItsDataAcrossSleeps runs a space under its own uid through a wake,
// a write, a sleep (checkpoint as the box) and a second wake (restore, handed back to
// the space's uid, which can write again).
func TestIsolatedSpaceOwnsItsDataAcrossSleeps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	dir, inst := reachableInstance(t, "iso")
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
		Network:     NetworkHost, // the network has its own tests, in namespaces of their own
		Limits:      Limits{Pids: 100},
	}
	e, err := New(Config{Bucket: b, StateDir: filepath.Join(dir, "state"), Holder: "box", Incarnation: "1",
		Kinds: map[string]Kind{"app": kind}, UIDFirst: 3200000, UIDCount: 100, PageReader: pagereadtest.Binary(t)})
	if err != nil {
		t.Fatal(err)
	}
	drainAtEnd(t, e)
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
	post() // kept by the box (it slept here), handed back to the space
	if !e.get(host).syncer.Reused() {
		t.Fatal("the wake after a sleep on this box did not keep the data dir")
	}
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

// frozenProbe is a bucket that notes, at each manifest write of an awake space, whether
// the isolated instance's cgroup is frozen: a checkpoint of a running instance must read the data dir
// only while no instance code runs.
type frozenProbe struct {
	bucket.Bucket
	e    *Engine
	host string
	mu   sync.Mutex
	seen []bool // one per manifest write of a running instance
}

func (b *frozenProbe) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	if strings.HasSuffix(key, "/manifest") {
		if in := b.e.lookup(b.host); in != nil {
			in.mu.Lock()
			p, awake := in.proc, in.state == StateAwake
			in.mu.Unlock()
			// The wake's fence rewrites the manifest while the new instance starts; it
			// reads nothing of the data dir. Checkpoints run while awake.
			if p != nil && !p.done() && awake {
				dir := p.group.Path()
				ev, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
				if err != nil {
					ev, _ = os.ReadFile(filepath.Join(dir, "freezer.state"))
				}
				b.mu.Lock()
				b.seen = append(b.seen, strings.Contains(string(ev), "frozen 1") || strings.Contains(string(ev), "FROZEN"))
				b.mu.Unlock()
			}
		}
	}
	return b.Bucket.Put(ctx, key, body, size, cond)
}

func TestCheckpointOfARunningIsolatedInstanceFreezesIt(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	dir, inst := reachableInstance(t, "iso")
	fb, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	probe := &frozenProbe{Bucket: fb, host: "frz.example.com"}
	e, err := New(Config{Bucket: probe, StateDir: filepath.Join(dir, "state"), Holder: "box", Incarnation: "1",
		Kinds: map[string]Kind{"app": {Command: inst, Env: map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
			Replication: Replication{Class: ReplicatePeriodic, Interval: 50 * time.Millisecond}, StopGrace: 5 * time.Second,
			Isolation: IsolationOn, Network: NetworkHost}}, UIDFirst: 3200200, UIDCount: 100, PageReader: pagereadtest.Binary(t)})
	if err != nil {
		t.Fatal(err)
	}
	probe.e = e
	drainAtEnd(t, e)
	u, err := e.Acquire(context.Background(), Space{Host: probe.host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", u.Socket())
	}}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		// Each note changes the data dir, so the next periodic sync writes a manifest.
		resp, err := c.Post("http://x/note", "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		probe.mu.Lock()
		n := len(probe.seen)
		probe.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d manifest writes of the running instance in 30s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	u.Release()
	// Not held across the request below: a sync that freezes the instance waits for the
	// lock in Put, and the request would wait for the frozen instance.
	probe.mu.Lock()
	seen := slices.Clone(probe.seen)
	probe.mu.Unlock()
	for i, frozen := range seen {
		if !frozen {
			t.Errorf("manifest write %d of a running isolated instance happened while it ran", i)
		}
	}
	// And it runs again afterwards.
	if resp, err := c.Post("http://x/note", "text/plain", nil); err != nil {
		t.Fatalf("instance after the checkpoints: %v", err)
	} else {
		resp.Body.Close()
	}
}

// BenchmarkWakeSleepIsolation wakes and sleeps one space under each isolation mode, side
// by side, and prints the ratio: go test ./engine -run X -bench WakeSleepIsolation (root).
func BenchmarkWakeSleepIsolation(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	dir, inst := reachableInstance(b, "isob")
	per := map[Isolation]time.Duration{}
	for _, mode := range []Isolation{IsolationNone, IsolationOn} {
		b.Run("isolation="+string(mode), func(b *testing.B) {
			fb, err := filebucket.New(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			e, err := New(Config{Bucket: fb, StateDir: filepath.Join(dir, "state-"+string(mode)), Holder: "box", Incarnation: "1",
				Kinds: map[string]Kind{"app": {Command: inst, Env: map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
					Replication: Replication{Class: ReplicateSleep}, StopGrace: 5 * time.Second, Isolation: mode, Network: NetworkHost}},
				UIDFirst: 3200400, UIDCount: 100, PageReader: pagereadtest.Binary(b)})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			sp := Space{Host: "bench.example.com", Kind: "app"}
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				u, err := e.Acquire(context.Background(), sp)
				if err != nil {
					b.Fatal(err)
				}
				u.Release()
				if err := e.Sleep(context.Background(), sp.Host); err != nil {
					b.Fatal(err)
				}
			}
			per[mode] = time.Since(start) / time.Duration(b.N)
		})
	}
	if per[IsolationNone] > 0 && per[IsolationOn] > 0 {
		b.Logf("wake+sleep: none %v, on %v: isolation costs x%.2f", per[IsolationNone], per[IsolationOn],
			float64(per[IsolationOn])/float64(per[IsolationNone]))
	}
}

// TestIsolationNeedsThePageReader: without lchat-pageread an isolated space's database
// checkpoints would all fail, so `isolation on` refuses to start naming the binary, and an
// unset isolation runs the kind as the box's user with that reason.
func TestIsolationNeedsThePageReader(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	dir, inst := reachableInstance(t, "nopr")
	fb, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "no-such-dir", "lchat-pageread")
	kind := Kind{Command: inst, Env: map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"}, Network: NetworkHost}
	on := kind
	on.Isolation = IsolationOn
	_, err = New(Config{Bucket: fb, StateDir: filepath.Join(dir, "state-on"), Holder: "box", Incarnation: "1",
		Kinds: map[string]Kind{"app": on}, UIDFirst: 3200600, UIDCount: 100, PageReader: missing})
	if err == nil || !strings.Contains(err.Error(), "lchat-pageread is missing") {
		t.Fatalf("isolation on without the page reader: %v, want a refusal naming lchat-pageread", err)
	}
	e, err := New(Config{Bucket: fb, StateDir: filepath.Join(dir, "state-auto"), Holder: "box", Incarnation: "1",
		Kinds: map[string]Kind{"app": kind}, UIDFirst: 3200600, UIDCount: 100, PageReader: missing})
	if err != nil {
		t.Fatal(err)
	}
	drainAtEnd(t, e)
	if e.isolated(kind) {
		t.Fatal("a kind with unset isolation is isolated without the page reader")
	}
	if why := e.whyNotIsolated(kind); why == nil || !strings.Contains(why.Error(), "lchat-pageread") {
		t.Fatalf("why not isolated: %v, want lchat-pageread named", why)
	}
}
