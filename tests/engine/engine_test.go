package engine_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
)

type fixture struct {
	t      testing.TB
	bucket bucket.Bucket
	starts string // file each instance start appends its PID to
	kind   engine.Kind
}

func newFixture(t testing.TB) *fixture {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, bucket: harness.StartS3(t).NewBucket(t, "fleet/"), starts: filepath.Join(t.TempDir(), "starts")}
	f.kind = engine.Kind{
		Command:      self,
		Env:          map[string]string{"LCHAT_TEST_INSTANCE": "1", "STARTS_FILE": f.starts},
		AllowedEnv:   []string{"ALLOWED", "START_DELAY_MS", "HANG", "IGNORE_TERM"},
		IdleTimeout:  time.Hour,
		StopGrace:    5 * time.Second,
		ReadyPath:    "/ready",
		ReadyTimeout: 20 * time.Second,
		Replication:  engine.Replication{Class: engine.ReplicateSleep},
		WakePath:     "/wake",
	}
	return f
}

// engine starts an engine on its own short state dir; mod edits the config first.
func (f *fixture) engine(incarnation string, mod func(*engine.Config)) *engine.Engine {
	t := f.t
	dir, err := os.MkdirTemp("", "eng")
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.Config{
		Bucket:      f.bucket,
		StateDir:    dir,
		Holder:      "https://box-a.test",
		Incarnation: incarnation,
		Kinds:       map[string]engine.Kind{"app": f.kind},
		Logger:      zaptest.NewLogger(t),
	}
	if mod != nil {
		mod(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		e.Drain(ctx)
		e.Close()
		os.RemoveAll(dir)
	})
	return e
}

func (f *fixture) startCount() int {
	data, err := os.ReadFile(f.starts)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

// call makes one HTTP request to the instance behind u.
func call(t testing.TB, u *engine.Use, method, path string) (int, string) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", u.Socket())
	}}}
	defer c.CloseIdleConnections()
	req, _ := http.NewRequest(method, "http://instance"+path, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func acquire(t testing.TB, e *engine.Engine, sp engine.Space) *engine.Use {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := e.Acquire(ctx, sp)
	if err != nil {
		t.Fatalf("acquire %s: %v", sp.Host, err)
	}
	return u
}

func status(e *engine.Engine, host string) engine.SpaceStatus {
	for _, s := range e.Status() {
		if s.Host == host {
			return s
		}
	}
	return engine.SpaceStatus{}
}

// settle bounds a wait for an observable outcome of the engine's own timers (an idle
// sleep, a sync, a fence): generous, as it is not a timing assertion.
const settle = 20 * time.Second

func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

func readLease(t testing.TB, b bucket.Bucket, host string) spacestore.Lease {
	t.Helper()
	l, _, err := spacestore.ReadLease(context.Background(), b, host)
	if err != nil {
		t.Fatalf("reading lease: %v", err)
	}
	return l
}

func TestWakeServeIdleSleepWake(t *testing.T) {
	f := newFixture(t)
	f.kind.IdleTimeout = 300 * time.Millisecond
	e := f.engine("1", nil)
	sp := engine.Space{Host: "one.test", Kind: "app", Env: map[string]string{
		"ALLOWED": "yes", "PATH": "/evil", "LD_PRELOAD": "/evil.so", "OTHER": "no"}}

	u := acquire(t, e, sp)
	if code, _ := call(t, u, "POST", "/msg?body=hello"); code != 200 {
		t.Fatalf("post message: %d", code)
	}
	for name, want := range map[string]string{"ALLOWED": "yes", "OTHER": "<unset>", "LD_PRELOAD": "<unset>", "LCHAT_HOST": "one.test"} {
		if _, got := call(t, u, "GET", "/env?name="+name); got != want {
			t.Errorf("instance env %s = %q, want %q", name, got, want)
		}
	}
	if _, got := call(t, u, "GET", "/env?name=PATH"); got == "/evil" {
		t.Error("route env overrode PATH")
	}
	pid := status(e, "one.test").PID
	if status(e, "one.test").State != engine.StateAwake || !alive(pid) {
		t.Fatalf("status after acquire = %+v", status(e, "one.test"))
	}
	// Held: the idle timer must not run. Wait past several idle timeouts.
	time.Sleep(1 * time.Second)
	if st := status(e, "one.test"); st.State != engine.StateAwake {
		t.Fatalf("space slept while a Use was held: %+v", st)
	}
	u.Release()
	harness.WaitFor(t, settle, "idle sleep", func() bool { return status(e, "one.test").State == engine.StateAsleep })
	if alive(pid) {
		t.Fatalf("instance %d still running after sleep", pid)
	}
	if l := readLease(t, f.bucket, "one.test"); !l.Released {
		t.Fatalf("lease after sleep = %+v, want released", l)
	}
	m, _, err := spacestore.ReadManifest(context.Background(), f.bucket, "one.test")
	if err != nil || m == nil || len(m.Files) != 1 || m.Files[0].Path != "app.db" {
		t.Fatalf("manifest after sleep = %+v, %v; want app.db", m, err)
	}

	u = acquire(t, e, sp)
	defer u.Release()
	if _, got := call(t, u, "GET", "/msgs"); got != "hello" {
		t.Fatalf("messages after wake = %q, want hello", got)
	}
	if c := e.Counters(); c.Wakes != 2 || c.Sleeps != 1 || f.startCount() != 2 {
		t.Fatalf("counters %+v starts %d, want 2 wakes, 1 sleep, 2 starts", c, f.startCount())
	}
}

func TestConcurrentAcquiresShareOneWake(t *testing.T) {
	f := newFixture(t)
	e := f.engine("1", nil)
	sp := engine.Space{Host: "busy.test", Kind: "app", Env: map[string]string{"START_DELAY_MS": "500"}}
	const n = 100
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sockets := make(chan string, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			u, err := e.Acquire(ctx, sp)
			if err != nil {
				errs <- err
				return
			}
			defer u.Release()
			if code, _ := call(t, u, "GET", "/ready"); code != 200 {
				errs <- errors.New("instance not serving after Acquire returned")
			}
			sockets <- u.Socket()
		}()
	}
	wg.Wait()
	close(errs)
	close(sockets)
	for err := range errs {
		t.Errorf("acquire: %v", err)
	}
	seen := map[string]bool{}
	for s := range sockets {
		seen[s] = true
	}
	if len(seen) != 1 || f.startCount() != 1 || e.Counters().Wakes != 1 {
		t.Fatalf("sockets %v, process starts %d, wakes %d; want one of each", seen, f.startCount(), e.Counters().Wakes)
	}
}

func TestForeignManifestFencesOut(t *testing.T) {
	f := newFixture(t)
	f.kind.Replication = engine.Replication{Class: engine.ReplicateContinuous}
	e := f.engine("1", nil)
	sp := engine.Space{Host: "fence.test", Kind: "app"}
	u := acquire(t, e, sp)
	defer u.Release()
	call(t, u, "POST", "/msg?body=first")
	harness.WaitFor(t, settle, "first continuous sync", func() bool { return !status(e, "fence.test").LastSync.IsZero() })
	pid := status(e, "fence.test").PID

	ctx := context.Background()
	_, etag, err := spacestore.ReadManifest(ctx, f.bucket, "fence.test")
	if err != nil {
		t.Fatal(err)
	}
	foreign := &spacestore.Manifest{Generation: 99, WrittenBy: "https://intruder.test", WrittenAt: time.Now()}
	if _, err := spacestore.WriteManifest(ctx, f.bucket, "fence.test", foreign, etag); err != nil {
		t.Fatal(err)
	}
	call(t, u, "POST", "/msg?body=second") // the next sync must lose its swap
	harness.WaitFor(t, settle, "fence-out", func() bool { return e.Counters().Fenced == 1 })
	if alive(pid) {
		t.Fatalf("instance %d still running after fence-out", pid)
	}
	if st := status(e, "fence.test"); st.State != engine.StateFenced || st.PID != 0 {
		t.Fatalf("status after fence-out = %+v", st)
	}
	// Give a buggy retry loop the chance to overwrite, then check the foreign state stands.
	time.Sleep(1500 * time.Millisecond)
	m, _, err := spacestore.ReadManifest(ctx, f.bucket, "fence.test")
	if err != nil || m.WrittenBy != "https://intruder.test" || m.Generation != 99 {
		t.Fatalf("manifest after fence-out = %+v, %v; want the foreign one", m, err)
	}
}

func TestCrashRecoveryAndBackoff(t *testing.T) {
	f := newFixture(t)
	e := f.engine("1", nil)
	sp := engine.Space{Host: "crashy.test", Kind: "app"}
	u := acquire(t, e, sp)
	call(t, u, "POST", "/msg?body=before-crash")
	pid := status(e, "crashy.test").PID
	crash(u)
	u.Release()
	harness.WaitFor(t, settle, "crash handled", func() bool {
		return e.Counters().Crashes == 1 && status(e, "crashy.test").State == engine.StateAsleep
	})
	if l := readLease(t, f.bucket, "crashy.test"); !l.Released {
		t.Fatalf("lease after crash = %+v, want released", l)
	}
	// The first crash: the next request wakes it, data intact (checkpointed after the crash).
	u = acquire(t, e, sp)
	if _, got := call(t, u, "GET", "/msgs"); got != "before-crash" {
		t.Fatalf("messages after crash recovery = %q", got)
	}
	if status(e, "crashy.test").PID == pid {
		t.Fatal("same PID after a crash")
	}
	crash(u)
	u.Release()
	harness.WaitFor(t, settle, "second crash handled", func() bool { return e.Counters().Crashes == 2 })
	var re *engine.RetryError
	harness.WaitFor(t, settle, "backoff refusal", func() bool {
		u, err := e.Acquire(context.Background(), sp)
		if err == nil {
			u.Release()
			t.Fatal("woke immediately after a repeated crash: no backoff")
		}
		return errors.As(err, &re)
	})
	if re.After < time.Second {
		t.Fatalf("retry after %v, want at least 1s", re.After)
	}
	starts := f.startCount()
	harness.WaitFor(t, settle, "wake after backoff", func() bool {
		u, err := e.Acquire(context.Background(), sp)
		if err != nil {
			return false
		}
		u.Release()
		return true
	})
	if f.startCount() != starts+1 {
		t.Fatalf("starts %d after backoff, want %d", f.startCount(), starts+1)
	}
}

func crash(u *engine.Use) {
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", u.Socket())
	}}}
	resp, err := c.Post("http://instance/crash", "", nil)
	if err == nil {
		resp.Body.Close()
	}
}

func TestScheduledWakeFires(t *testing.T) {
	f := newFixture(t)
	f.kind.IdleTimeout = 200 * time.Millisecond
	e := f.engine("1", func(c *engine.Config) { c.WakeScanInterval = 100 * time.Millisecond })
	sp := engine.Space{Host: "remind.test", Kind: "app"}
	u := acquire(t, e, sp)
	due := time.Now().Add(2 * time.Second).UTC().Format(time.RFC3339Nano)
	call(t, u, "POST", "/next-wake?at="+url.QueryEscape(due))
	u.Release()
	harness.WaitFor(t, settle, "sleep", func() bool { return status(e, "remind.test").State == engine.StateAsleep })
	if _, err := f.bucket.Head(context.Background(), spacestore.WakeKey("remind.test")); err != nil {
		t.Fatalf("wake record after sleep: %v", err)
	}
	harness.WaitFor(t, settle, "scheduled wake delivered and record deleted", func() bool {
		_, err := f.bucket.Head(context.Background(), spacestore.WakeKey("remind.test"))
		return errors.Is(err, bucket.ErrNotFound)
	})
	if e.Counters().Wakes != 2 {
		t.Fatalf("wakes = %d, want 2", e.Counters().Wakes)
	}
	u = acquire(t, e, sp)
	defer u.Release()
	if _, got := call(t, u, "GET", "/wakes"); got != "scheduled" {
		t.Fatalf("instance saw wake reasons %q, want one scheduled POST", got)
	}
}

func TestLeaseHeldByLiveOtherBox(t *testing.T) {
	f := newFixture(t)
	other := spacestore.Holder{ID: "https://box-b.test", Incarnation: "7"}
	if _, err := spacestore.AcquireLease(context.Background(), f.bucket, "held.test", other, time.Now()); err != nil {
		t.Fatal(err)
	}
	live := true
	e := f.engine("1", func(c *engine.Config) {
		c.HolderLive = func(h, i string) bool { return h == other.ID && i == other.Incarnation && live }
	})
	_, err := e.Acquire(context.Background(), engine.Space{Host: "held.test", Kind: "app"})
	var held *engine.LeaseHeldError
	if !errors.As(err, &held) || held.Holder != other.ID {
		t.Fatalf("acquire = %v, want LeaseHeldError from %s", err, other.ID)
	}
	if f.startCount() != 0 || e.Counters().LeaseConflicts != 1 {
		t.Fatalf("starts %d conflicts %d; want no start and one conflict", f.startCount(), e.Counters().LeaseConflicts)
	}
	live = false // box-b's heartbeat went stale: its lease is free without any write by it
	u := acquire(t, e, engine.Space{Host: "held.test", Kind: "app"})
	u.Release()
	if l := readLease(t, f.bucket, "held.test"); l.Holder != "https://box-a.test" {
		t.Fatalf("lease after takeover = %+v", l)
	}
}

func TestDrainCheckpointsAndReleases(t *testing.T) {
	f := newFixture(t)
	e := f.engine("1", nil)
	hosts := []string{"d1.test", "d2.test", "d3.test"}
	var pids []int
	for _, h := range hosts {
		u := acquire(t, e, engine.Space{Host: h, Kind: "app"})
		call(t, u, "POST", "/msg?body=from-"+h)
		u.Release()
		pids = append(pids, status(e, h).PID)
	}
	if err := e.Drain(context.Background()); err != nil {
		t.Fatalf("drain: %v", err)
	}
	for i, h := range hosts {
		if alive(pids[i]) {
			t.Errorf("%s instance still running after drain", h)
		}
		if l := readLease(t, f.bucket, h); !l.Released {
			t.Errorf("%s lease after drain = %+v", h, l)
		}
	}
	if _, err := e.Acquire(context.Background(), engine.Space{Host: "d1.test", Kind: "app"}); err == nil {
		t.Fatal("acquire after drain succeeded")
	}
	// A new incarnation (the box restarted) sees the latest state.
	e2 := f.engine("2", nil)
	for _, h := range hosts {
		u := acquire(t, e2, engine.Space{Host: h, Kind: "app"})
		if _, got := call(t, u, "GET", "/msgs"); got != "from-"+h {
			t.Errorf("%s after drain and restart: %q", h, got)
		}
		u.Release()
	}
}

func TestReadinessTimeout(t *testing.T) {
	f := newFixture(t)
	f.kind.ReadyTimeout = 300 * time.Millisecond
	e := f.engine("1", nil)
	_, err := e.Acquire(context.Background(), engine.Space{Host: "hang.test", Kind: "app", Env: map[string]string{"HANG": "1"}})
	var re *engine.RetryError
	if !errors.As(err, &re) || re.After <= 0 {
		t.Fatalf("acquire of a never-ready instance = %v, want RetryError", err)
	}
	data, _ := os.ReadFile(f.starts)
	var pid int
	for _, line := range bytes.Fields(data) {
		pid = atoiOr0(string(line))
	}
	harness.WaitFor(t, settle, "hung instance killed", func() bool { return !alive(pid) })
	if l := readLease(t, f.bucket, "hang.test"); !l.Released {
		t.Fatalf("lease after readiness failure = %+v, want released", l)
	}
}

func TestUnknownKind(t *testing.T) {
	f := newFixture(t)
	e := f.engine("1", nil)
	if _, err := e.Acquire(context.Background(), engine.Space{Host: "x.test", Kind: "nope"}); !errors.Is(err, engine.ErrUnknownKind) {
		t.Fatalf("acquire = %v, want ErrUnknownKind", err)
	}
}

func atoiOr0(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}
