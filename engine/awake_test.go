package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

// TestMain doubles as a minimal instance: with LCHAT_ENGINE_TEST_INSTANCE=1 (set through
// a kind's Env) this test binary listens on $LCHAT_SOCKET until SIGTERM.
func TestMain(m *testing.M) {
	if os.Getenv("LCHAT_ENGINE_TEST_CHILD") == "1" {
		select {} // a child the instance left in its process group
	}
	if os.Getenv("LCHAT_ENGINE_TEST_INSTANCE") == "1" {
		if os.Getenv("SPAWN_CHILD") == "1" {
			child := exec.Command(os.Args[0])
			child.Env = append(os.Environ(), "LCHAT_ENGINE_TEST_INSTANCE=", "LCHAT_ENGINE_TEST_CHILD=1")
			if err := child.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			os.WriteFile(filepath.Join(os.Getenv("LCHAT_DATA_DIR"), "child.pid"), []byte(strconv.Itoa(child.Process.Pid)), 0o600)
		}
		if os.Getenv("START_NOTE") == "1" {
			// A change to the data dir before the first request, as an app's migration
			// at start makes one.
			f, err := os.OpenFile(filepath.Join(os.Getenv("LCHAT_DATA_DIR"), "notes.txt"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
			if err == nil {
				fmt.Fprintf(f, "start %d\n", os.Getpid())
				f.Close()
			}
		}
		if ms, _ := strconv.Atoi(os.Getenv("START_DELAY_MS")); ms > 0 {
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		if code, _ := strconv.Atoi(os.Getenv("EXIT_AT_START")); code > 0 {
			os.Exit(code)
		}
		if os.Getenv("IGNORE_FD") == "1" {
			select {} // runs, never accepts on the passed listener
		}
		ln, err := testInstanceListener()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		notes := filepath.Join(os.Getenv("LCHAT_DATA_DIR"), "notes.txt")
		var requests atomic.Int64
		go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/info" {
				// What the instance sees of itself: socket activation's contract.
				json.NewEncoder(w).Encode(map[string]any{"pid": os.Getpid(), "uid": os.Getuid(),
					"listen_pid": os.Getenv("LISTEN_PID"), "listen_fds": os.Getenv("LISTEN_FDS"),
					"listen_fdnames": os.Getenv("LISTEN_FDNAMES"), "lchat_socket": os.Getenv("LCHAT_SOCKET"),
					"requests": requests.Add(1)})
				return
			}
			requests.Add(1)
			if r.Method == http.MethodPost && r.URL.Path == "/crash" {
				os.Exit(3)
			}
			if r.Method == http.MethodPost && r.URL.Path == "/dial" {
				dialFromInstance(w, r.URL.Query().Get("addr"))
				return
			}
			if r.Method == http.MethodPost {
				f, err := os.OpenFile(notes, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
				if err != nil {
					http.Error(w, err.Error(), 500)
					return
				}
				fmt.Fprintln(f, r.URL.Path)
				f.Close()
			}
		}))
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		<-sig
		ln.Close()
		os.Exit(0)
	}
	code := m.Run()
	if n := refusedTransitions.Load() - askedRefusals.Load(); n > 0 && code == 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the engine refused %d state transitions it attempted (see the error logs)\n", n)
		code = 1
	}
	os.Exit(code)
}

// testInstanceListener is the test instance's listener: the one passed to it under
// socket activation (checked as sd_listen_fds(3) does), else $LCHAT_SOCKET.
func testInstanceListener() (net.Listener, error) {
	if os.Getenv("LISTEN_FDS") == "" {
		return net.Listen("unix", os.Getenv("LCHAT_SOCKET"))
	}
	if os.Getenv("LISTEN_PID") != strconv.Itoa(os.Getpid()) || os.Getenv("LISTEN_FDS") != "1" {
		return nil, fmt.Errorf("LISTEN_PID %s is not this process (%d)", os.Getenv("LISTEN_PID"), os.Getpid())
	}
	return net.FileListener(os.NewFile(3, "http"))
}

// drainAtEnd drains and closes e when the test ends.
func drainAtEnd(t testing.TB, e *Engine) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		e.Drain(ctx)
		e.Close()
	})
}

func newAwakeTestEngine(t testing.TB, delay time.Duration) *Engine {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "eng")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e, err := New(Config{
		Bucket: b, StateDir: dir, Holder: "box", Incarnation: "1",
		Kinds: map[string]Kind{"app": {
			Command:     self,
			Env:         map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1", "START_DELAY_MS": strconv.Itoa(int(delay / time.Millisecond))},
			Replication: Replication{Class: ReplicateSleep},
			StopGrace:   5 * time.Second,
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	drainAtEnd(t, e)
	return e
}

// TestAwake follows one space through a real wake and sleep: Here is true from the
// start of the wake until the sleep begins, and false for hosts the engine never saw.
func TestAwake(t *testing.T) {
	e := newAwakeTestEngine(t, 300*time.Millisecond)
	const host = "a.example.com"
	if e.Here(host) {
		t.Fatal("Awake before any wake")
	}
	type result struct {
		u   *Use
		err error
	}
	done := make(chan result, 1)
	go func() {
		u, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"})
		done <- result{u, err}
	}()
	sawWaking := false
	var res result
wait:
	for {
		select {
		case res = <-done:
			break wait
		default:
		}
		if e.Here(host) {
			sawWaking = true
		}
		time.Sleep(5 * time.Millisecond)
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	if !sawWaking {
		t.Error("Awake was false while the space was waking")
	}
	if !e.Here(host) {
		t.Fatal("Awake false for an awake space")
	}
	if e.Here("b.example.com") {
		t.Fatal("Awake true for another host")
	}
	res.u.Release()
	if err := e.Sleep(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	if e.Here(host) {
		t.Fatal("Awake true after Sleep")
	}
	if st := e.Status(); len(st) != 1 || st[0].State != StateAsleep {
		t.Fatalf("status after sleep: %+v", st)
	}
}

// TestAwakeNoAlloc: the request path's check allocates nothing, whatever the number of
// spaces the engine knows.
func TestAwakeNoAlloc(t *testing.T) {
	e := newAwakeTestEngine(t, 0)
	for i := 0; i < 1000; i++ {
		in := e.get(fmt.Sprintf("s%d.example.com", i))
		in.mu.Lock()
		in.putLocked(StateAwake)
		in.mu.Unlock()
	}
	if !e.Here("s500.example.com") || e.Here("nope.example.com") {
		t.Fatal("Awake answers wrong")
	}
	if n := testing.AllocsPerRun(1000, func() { e.Here("s500.example.com") }); n != 0 {
		t.Fatalf("Awake allocates %v times per call", n)
	}
}

// BenchmarkAwake compares Here with the Status scan the handler used before, with 1000
// spaces known to the engine.
func BenchmarkAwake(b *testing.B) {
	e := newAwakeTestEngine(b, 0)
	for i := 0; i < 1000; i++ {
		in := e.get(fmt.Sprintf("s%d.example.com", i))
		in.mu.Lock()
		in.putLocked(StateAwake)
		in.mu.Unlock()
	}
	b.Run("Awake", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			e.Here("s500.example.com")
		}
	})
	b.Run("StatusScan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, s := range e.Status() {
				if s.Host == "s500.example.com" {
					break
				}
			}
		}
	})
}

// TestDrainingServesAwakeSpaces: while the box drains, a space still awake on it is
// served (until the drain puts it to sleep), and none is woken: ErrDraining says so, so
// the mesh sends the request to the box that takes the space over.
func TestDrainingServesAwakeSpaces(t *testing.T) {
	e := newAwakeTestEngine(t, 0)
	ctx := context.Background()
	u, err := e.Acquire(ctx, Space{Host: "awake.example.com", Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	u.Release()
	e.life.Drain() // as Drain does first
	u, err = e.Acquire(ctx, Space{Host: "awake.example.com", Kind: "app"})
	if err != nil {
		t.Fatalf("an awake space while draining: %v, want it served", err)
	}
	u.Release()
	if _, err := e.Acquire(ctx, Space{Host: "asleep.example.com", Kind: "app"}); !errors.Is(err, ErrDraining) {
		t.Fatalf("an asleep space while draining: %v, want ErrDraining", err)
	}
	var re *RetryError
	if _, err := e.Acquire(ctx, Space{Host: "asleep.example.com", Kind: "app"}); !errors.As(err, &re) || re.After <= 0 {
		t.Fatalf("ErrDraining is not a RetryError with a Retry-After: %v", err)
	}
	if e.Here("asleep.example.com") {
		t.Fatal("a draining box woke a space")
	}
}

// TestDrainAnswersRequestsAlreadyIn: a request that got its space's instance just before
// the drain reached that space is answered, not cut (the rolling restart of
// TestEveryRequestReachesTheHolder saw two 503s "its instance gave no answer: EOF" when a
// wake finished during the drain); requests after it get ErrDraining, so the mesh sends
// them to the box that takes the space over.
func TestDrainAnswersRequestsAlreadyIn(t *testing.T) {
	// The drain must wait for the request, however slow the machine: no grace ends first.
	defer func(g time.Duration) { drainUseGrace = g }(drainUseGrace)
	drainUseGrace = 5 * time.Minute
	e := newAwakeTestEngine(t, 0)
	ctx := context.Background()
	const host = "inflight.example.com"
	u, err := e.Acquire(ctx, Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	drained := make(chan error, 1)
	go func() { drained <- e.Drain(ctx) }()
	in := e.lookup(host)
	deadline := time.Now().Add(10 * time.Second)
	for {
		in.mu.Lock()
		q := in.draining
		in.mu.Unlock()
		if q || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := e.Acquire(ctx, Space{Host: host, Kind: "app"}); !errors.Is(err, ErrDraining) {
		t.Fatalf("a new request to the space being drained: %v, want ErrDraining", err)
	}
	select {
	case err := <-drained:
		t.Fatalf("the drain ended (%v) while a request still held the instance", err)
	case <-time.After(100 * time.Millisecond):
	}
	if code, _, err := rawGet(t, u.Socket(), "/info", 10*time.Second); err != nil || code != http.StatusOK {
		t.Fatalf("the request already in: %d, %v; want it answered", code, err)
	}
	u.Release()
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	if e.Here(host) {
		t.Fatal("still awake after the drain")
	}
}
