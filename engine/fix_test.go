package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/internal/testwait"
	"github.com/lchat/lchat-caddy/spacestore"
)

func newCountingEngine(t testing.TB, cfg Config) (*Engine, *membucket.Counting) {
	t.Helper()
	fb, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := membucket.NewCounting(fb)
	cfg.Bucket = c
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	cfg.Holder, cfg.Incarnation = "box", "1"
	if cfg.Kinds == nil {
		cfg.Kinds = map[string]Kind{"app": {Command: "/bin/true"}}
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e, c
}

// TestHeldSpaceStartsOneRecheck: requests to a space held after a heartbeat fence start
// one lease re-read between them, not a goroutine each, however slow the bucket is.
func TestHeldSpaceStartsOneRecheck(t *testing.T) {
	e, c := newCountingEngine(t, Config{})
	defer e.Close()
	const host = "held.example.com"
	unblock := make(chan struct{})
	c.SetFail(func(ctx context.Context, op membucket.Op, key string) error {
		if key == spacestore.LeaseKey(host) {
			select {
			case <-unblock:
			case <-ctx.Done():
			}
			return errors.New("bucket unavailable")
		}
		return nil
	})
	in := e.get(host)
	in.mu.Lock()
	in.leaseETag = "etag"
	in.putLocked(StateHeld)
	in.mu.Unlock()

	before := runtime.NumGoroutine()
	for range 500 {
		_, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"})
		var re *RetryError
		if !errors.As(err, &re) {
			t.Fatalf("Acquire of a held space: %v, want a RetryError", err)
		}
	}
	if grown := runtime.NumGoroutine() - before; grown > 5 {
		t.Fatalf("%d goroutines started by 500 requests to a held space, want at most one recheck", grown)
	}
	close(unblock)
	deadline := time.Now().Add(5 * time.Second)
	for stateOf(in) == StateRechecking && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if st := stateOf(in); st != StateHeld {
		t.Fatalf("state after the recheck failed on the bucket = %s, want held", st)
	}
}

// wakeRecord reads wakes/<host>: its time, or ok false when there is none.
func wakeRecord(t *testing.T, b bucket.Bucket, host string) (time.Time, bool) {
	t.Helper()
	obj, err := b.Get(context.Background(), spacestore.WakeKey(host))
	if errors.Is(err, bucket.ErrNotFound) {
		return time.Time{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Body.Close()
	data, _ := io.ReadAll(obj.Body)
	at, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return at, true
}

// TestScheduledWakeRecordSurvivesFailedWrite: a space goes to sleep asking for a wake
// while the bucket refuses the wake record; the record is written once the bucket
// takes it again. A newer intent (the route removed) replaces a pending one: the retry
// never writes the older record over it.
func TestScheduledWakeRecordSurvivesFailedWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "eng")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	e, c := newCountingEngine(t, Config{StateDir: dir, Kinds: map[string]Kind{"app": {
		Command:     self,
		Env:         map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
		Replication: Replication{Class: ReplicateSleep},
		StopGrace:   5 * time.Second,
	}}})
	defer e.Close()
	e.wakeRecordBackoff.First = 10 * time.Millisecond
	// Writes of wake records fail while these count down.
	var failPuts, failDeletes atomic.Int64
	c.SetFail(func(ctx context.Context, op membucket.Op, key string) error {
		if !strings.HasPrefix(key, spacestore.WakesPrefix) {
			return nil
		}
		if op == membucket.OpPut && failPuts.Add(-1) >= 0 || op == membucket.OpDelete && failDeletes.Add(-1) >= 0 {
			return errors.New("injected: bucket refused the wake record")
		}
		return nil
	})

	sleepAsking := func(host string, at time.Time) {
		t.Helper()
		u, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"})
		if err != nil {
			t.Fatal(err)
		}
		in := e.lookup(host)
		if err := os.MkdirAll(filepath.Join(in.dataDir, ".lchat"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(in.dataDir, filepath.FromSlash(spacestore.NextWakeFile)), []byte(at.Format(time.RFC3339)), 0o600); err != nil {
			t.Fatal(err)
		}
		u.Release()
		if err := e.Sleep(context.Background(), host); err != nil {
			t.Fatal(err)
		}
	}

	// Three failed writes, then the bucket takes it.
	at := time.Now().Add(time.Hour).Truncate(time.Second).UTC()
	failPuts.Store(3)
	sleepAsking("a.example.com", at)
	testwait.WaitFor(t, 10*time.Second, "the wake record after failed writes", func() bool {
		got, ok := wakeRecord(t, c.Bucket, "a.example.com")
		return ok && got.Equal(at)
	})

	// The bucket refuses the record, then its deletion when the route is removed; the
	// deletion lands first, and the pending retry of the record must then give up
	// instead of writing it back once the bucket takes puts again.
	failPuts.Store(1 << 30)
	failDeletes.Store(1)
	sleepAsking("b.example.com", at)
	if err := e.Remove(context.Background(), "b.example.com"); err != nil {
		t.Fatal(err)
	}
	testwait.WaitFor(t, 10*time.Second, "the retried removal to land", func() bool { return failDeletes.Load() < 0 })
	failPuts.Store(0)
	time.Sleep(300 * time.Millisecond) // the record's retry (10ms backoff, doubling) tries again by now
	e.Close()
	if got, ok := wakeRecord(t, c.Bucket, "b.example.com"); ok {
		t.Fatalf("wake record %v written back after the route was removed", got)
	}
}

// TestRemoveDeletesWakeRecord: removing a route deletes its scheduled wake record, even
// on a box that never ran the space.
func TestRemoveDeletesWakeRecord(t *testing.T) {
	e, c := newCountingEngine(t, Config{})
	defer e.Close()
	const host = "gone.example.com"
	if _, err := spacestore.PutWake(context.Background(), c, host, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := e.Remove(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	if _, ok := wakeRecord(t, c, host); ok {
		t.Fatal("wake record of a removed route still in the bucket")
	}
}

// TestScanDeletesWakeOfHostWithNoRoute: a due wake record for a host with no route is
// deleted by the box that owns the host, and left alone by a box that does not (with
// the mesh another box may have the route).
func TestScanDeletesWakeOfHostWithNoRoute(t *testing.T) {
	e, c := newCountingEngine(t, Config{
		WakeScanInterval: 10 * time.Millisecond,
		Resolve:          func(string) (Space, bool) { return Space{}, false },
		Owns:             func(host string, _ time.Duration) bool { return host == "mine.example.com" },
	})
	defer e.Close()
	past := time.Now().Add(-time.Minute)
	for _, h := range []string{"mine.example.com", "theirs.example.com"} {
		if _, err := spacestore.PutWake(context.Background(), c, h, past); err != nil {
			t.Fatal(err)
		}
	}
	e.Start()
	testwait.WaitFor(t, 10*time.Second, "the owned record deleted", func() bool {
		_, ok := wakeRecord(t, c, "mine.example.com")
		return !ok
	})
	lists := c.Counts()[membucket.OpList]
	testwait.WaitFor(t, 10*time.Second, "two more scans", func() bool { return c.Counts()[membucket.OpList] >= lists+2 })
	if _, ok := wakeRecord(t, c, "theirs.example.com"); !ok {
		t.Fatal("a box that does not own the host deleted its wake record")
	}
}

// procGone reports whether pid no longer runs (gone, or a zombie nobody reaped yet).
func procGone(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && (s[i+2] == 'Z' || s[i+2] == 'X')
}

// dying fails unless pid is gone within a moment: it was sent SIGKILL (which takes a
// scheduling round to act on a loaded machine).
func dying(t *testing.T, pid int, when string) {
	t.Helper()
	for start := time.Now(); !procGone(pid); time.Sleep(time.Millisecond) {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("%s: child %d of the instance still running after the instance was reaped", when, pid)
		}
	}
}

// TestInstanceGroupKilledBeforeReap: a child the instance left in its process group dies
// with it, when the instance crashes and when it is stopped, and by the time the engine
// has reaped the instance (after the reap the group id may belong to another process,
// so it must not be signalled then).
func TestInstanceGroupKilledBeforeReap(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "eng")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	e, _ := newCountingEngine(t, Config{StateDir: dir, Kinds: map[string]Kind{"app": {
		Command:     self,
		Env:         map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1", "SPAWN_CHILD": "1"},
		Replication: Replication{Class: ReplicateSleep},
		StopGrace:   5 * time.Second,
	}}})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		e.Drain(ctx)
		e.Close()
	}()

	wake := func(host string) (*Use, *proc, int) {
		t.Helper()
		u, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"})
		if err != nil {
			t.Fatal(err)
		}
		in := e.lookup(host)
		in.mu.Lock()
		p := in.proc
		in.mu.Unlock()
		var child int
		testwait.WaitFor(t, 10*time.Second, "the instance's child", func() bool {
			b, err := os.ReadFile(filepath.Join(in.dataDir, "child.pid"))
			child, _ = strconv.Atoi(string(b))
			return err == nil && child > 0
		})
		if procGone(child) {
			t.Fatalf("child %d not running", child)
		}
		t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
		return u, p, child
	}

	// Crash: the instance exits on its own.
	u, p, child := wake("crash.example.com")
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", u.Socket())
	}}}
	if resp, err := client.Post("http://instance/crash", "", nil); err == nil {
		resp.Body.Close()
	}
	client.CloseIdleConnections()
	<-p.exited
	dying(t, child, "crash")
	u.Release()

	// Stop: the instance exits on SIGTERM.
	u, p, child = wake("stop.example.com")
	u.Release()
	if err := e.Sleep(context.Background(), "stop.example.com"); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	dying(t, child, "stop")
	p.signal(syscall.SIGKILL) // after the reap: must be a no-op, whatever now has that pid
}
