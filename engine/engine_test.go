package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/spacestore"
)

func TestInstanceEnvFiltersRouteEnv(t *testing.T) {
	k := Kind{Env: map[string]string{"KIND_VAR": "k"}, AllowedEnv: []string{"ADMIN_TOKEN", "NAME"}}
	sp := Space{Host: "h.test", Env: map[string]string{
		"ADMIN_TOKEN": "s3cret", "NAME": "n", "PATH": "/evil", "LD_PRELOAD": "x.so",
		"LCHAT_SOCKET": "/tmp/evil", "UNLISTED": "u",
	}}
	env, dropped := instanceEnv(k, sp, "/run/s.sock", "/run/c.sock", "/data/h")
	last := map[string]string{}
	for _, kv := range env {
		n, v, _ := strings.Cut(kv, "=")
		last[n] = v // exec uses the last value of a duplicated name
	}
	for n, want := range map[string]string{"KIND_VAR": "k", "ADMIN_TOKEN": "s3cret", "NAME": "n",
		"LCHAT_HOST": "h.test", "LCHAT_SOCKET": "/run/s.sock", "LCHAT_CONTROL_SOCKET": "/run/c.sock", "LCHAT_DATA_DIR": "/data/h"} {
		if last[n] != want {
			t.Errorf("%s = %q, want %q", n, last[n], want)
		}
	}
	if last["PATH"] == "/evil" || last["LD_PRELOAD"] != "" || last["UNLISTED"] != "" {
		t.Errorf("forbidden or unlisted route env passed: %v", last)
	}
	if want := []string{"LCHAT_SOCKET", "LD_PRELOAD", "PATH", "UNLISTED"}; !slices.Equal(dropped, want) {
		t.Errorf("dropped = %v, want %v", dropped, want)
	}
	for _, d := range dropped {
		if strings.Contains(d, "=") || strings.Contains(d, "s3cret") {
			t.Errorf("dropped list carries a value: %q", d)
		}
	}
}

func TestKindDefaultsAndValidation(t *testing.T) {
	k, err := Kind{Command: "/bin/app"}.withDefaults("app")
	if err != nil {
		t.Fatal(err)
	}
	if k.Name != "app" || k.IdleTimeout != 10*time.Minute || k.StopSignal != syscall.SIGTERM || k.StopGrace != 10*time.Second ||
		k.ReadyTimeout != 30*time.Second || k.Replication != (Replication{Class: ReplicatePeriodic, Interval: time.Minute}) || k.WakePath != "/" {
		t.Fatalf("defaults = %+v", k)
	}
	for name, bad := range map[string]Kind{
		"no command":      {},
		"allows PATH":     {Command: "x", AllowedEnv: []string{"PATH"}},
		"allows LD_":      {Command: "x", AllowedEnv: []string{"LD_LIBRARY_PATH"}},
		"allows DYLD_":    {Command: "x", AllowedEnv: []string{"DYLD_INSERT_LIBRARIES"}},
		"allows BASH_ENV": {Command: "x", AllowedEnv: []string{"BASH_ENV"}},
		"allows LCHAT_":   {Command: "x", AllowedEnv: []string{"LCHAT_DATA_DIR"}},
		"bad class":       {Command: "x", Replication: Replication{Class: "hourly"}},
		"bad ready path":  {Command: "x", ReadyPath: "ready"},
		"bad env name":    {Command: "x", Env: map[string]string{"A=B": "c"}},
	} {
		if _, err := bad.withDefaults("k"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Errors name the config field, so an operator finds it whichever way the kind was
	// configured.
	for _, tc := range []struct {
		name string
		kind Kind
		want string
	}{
		{"demo", Kind{}, "command: required"},
		{"Demo", Kind{Command: "x"}, "invalid kind name"},
		{"de.mo", Kind{Command: "x"}, "invalid kind name"},
		{"demo", Kind{Command: "x", AllowedEnv: []string{"PATH"}}, "allowed_env: PATH"},
		{"demo", Kind{Command: "x", AllowedEnv: []string{"LD_PRELOAD"}}, "allowed_env: LD_PRELOAD"},
		{"demo", Kind{Command: "x", Replication: Replication{Class: "hourly"}}, "replication.class"},
		{"demo", Kind{Command: "x", Replication: Replication{Class: "sleep", Interval: time.Second}}, "replication.interval"},
		{"demo", Kind{Command: "x", Replication: Replication{Interval: -time.Second}}, "replication.interval"},
		{"demo", Kind{Command: "x", ReadyPath: "healthz"}, "ready_path"},
		{"demo", Kind{Command: "x", WakePath: "wake"}, "wake_path"},
		{"demo", Kind{Command: "x", IdleTimeout: -1}, "idle_timeout"},
		{"demo", Kind{Command: "x", Retention: -1}, "retention"},
		{"demo", Kind{Command: "x", GCGrace: -1}, "gc_grace"},
		{"demo", Kind{Command: "x", StopGrace: -1}, "stop_grace"},
	} {
		_, err := tc.kind.withDefaults(tc.name)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("withDefaults(%s, %+v) = %v, want %q", tc.name, tc.kind, err, tc.want)
		}
	}
	if k, err := (Kind{Command: "x"}).withDefaults("demo"); err != nil || k.GCGrace != spacestore.DefaultGCGrace || k.Retention != spacestore.DefaultRetention {
		t.Errorf("defaults: gc_grace %v retention %v, %v", k.GCGrace, k.Retention, err)
	}
	if _, err := ParseSignal("SIGWHAT"); err == nil || !strings.Contains(err.Error(), "stop_signal") {
		t.Errorf("ParseSignal(SIGWHAT) = %v", err)
	}
	for in, want := range map[string]syscall.Signal{"": 0, "int": syscall.SIGINT, "SIGHUP": syscall.SIGHUP, "usr1": syscall.SIGUSR1} {
		if got, err := ParseSignal(in); err != nil || got != want {
			t.Errorf("ParseSignal(%q) = %v, %v", in, got, err)
		}
	}
}

func TestCheckSpaceKind(t *testing.T) {
	kinds := map[string]Kind{"demo": {Name: "demo", AllowedEnv: []string{"ADMIN_TOKEN"}}}
	for _, tc := range []struct {
		kind string
		env  map[string]string
		want string
	}{
		{"demo", map[string]string{"ADMIN_TOKEN": "x"}, ""},
		{"chat", nil, `kind "chat" is not configured on this box (configured: demo)`},
		{"demo", map[string]string{"PATH": "/evil"}, "env PATH is not allowed"},
	} {
		err := CheckSpaceKind(kinds, tc.kind, tc.env)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckSpaceKind(%s, %v) = %v, want %q", tc.kind, tc.env, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "/evil") {
			t.Errorf("error echoes an env value: %v", err)
		}
	}
}

func TestValidHost(t *testing.T) {
	for h, want := range map[string]bool{"a.example.com": true, "xn--bcher-kva.example": true,
		"": false, "..": false, "a/b": false, ".hidden": false, "a\x00b": false} {
		if validHost(h) != want {
			t.Errorf("validHost(%q) = %v", h, !want)
		}
	}
}

func TestContinuousDebounce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var state atomic.Uint64
		var mu sync.Mutex
		var syncList []time.Duration
		syncs := func() []time.Duration { mu.Lock(); defer mu.Unlock(); return slices.Clone(syncList) }
		start := time.Now()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			debounce(ctx, time.Now, 0, func() (uint64, error) { return state.Load(), nil }, func() { mu.Lock(); syncList = append(syncList, time.Since(start)); mu.Unlock() })
		}()

		// One change: synced within about a second, once.
		time.Sleep(50 * time.Millisecond)
		state.Add(1)
		time.Sleep(2 * time.Second)
		if got := syncs(); len(got) != 1 || got[0] > time.Second+50*time.Millisecond {
			t.Fatalf("one change: syncs at %v, want one within 1s", got)
		}
		// Continuous writes for 3s: still synced at least every ~second, not starved.
		before := len(syncs())
		begin := time.Since(start)
		for range 30 {
			state.Add(1)
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(time.Second)
		got := syncs()[before:]
		if len(got) < 3 {
			t.Fatalf("3s of writes gave syncs at %v (from %v), want one about every second", got, begin)
		}
		for i := 1; i < len(got); i++ {
			if gap := got[i] - got[i-1]; gap > continuousMaxDelay+2*continuousPoll {
				t.Fatalf("gap %v between syncs under continuous writes", gap)
			}
		}
		// No change: no sync.
		n := len(syncs())
		time.Sleep(5 * time.Second)
		if len(syncs()) != n {
			t.Fatalf("synced without a change: %v", syncs())
		}
		cancel()
		<-done
	})
}

// TestContinuousSyncSeesAWriteBeforeTheLoopRuns: a write made before the continuous loop's
// goroutine first ran (the first request right after a wake, on a loaded box) is still a
// change against the baseline taken at the wake, and is synced. Before, the loop took its
// baseline when it started, after the write, and the write waited for the next one (CI saw
// TestForeignManifestFencesOut time out waiting for the first continuous sync).
func TestContinuousSyncSeesAWriteBeforeTheLoopRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var state atomic.Uint64
		base := state.Load() // the wake's baseline
		state.Add(1)         // the first request's write, before the loop runs
		var syncs atomic.Int32
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			debounce(ctx, time.Now, base, func() (uint64, error) { return state.Load(), nil }, func() { syncs.Add(1) })
		}()
		time.Sleep(2 * time.Second)
		if n := syncs.Load(); n != 1 {
			t.Fatalf("a write before the loop ran: %d syncs in 2s, want 1", n)
		}
		cancel()
		<-done
	})
}

// TestSetKinds checks what a config reload relies on: the next wake sees the reloaded
// kinds, and an invalid set is refused without touching the running one.
func TestSetKinds(t *testing.T) {
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{
		Bucket: b, StateDir: t.TempDir(), Holder: "box", Incarnation: "1",
		Kinds: map[string]Kind{"old": {Command: "/bin/true"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, ok := e.kind("old"); !ok {
		t.Fatal("kind old missing after New")
	}
	if err := e.SetKinds(map[string]Kind{"bad": {}}); err == nil {
		t.Fatal("SetKinds accepted a kind without a command")
	}
	if _, ok := e.kind("old"); !ok {
		t.Fatal("a refused SetKinds replaced the running kinds")
	}
	if err := e.SetKinds(map[string]Kind{"new": {Command: "/bin/true"}}); err != nil {
		t.Fatal(err)
	}
	if k, ok := e.kind("new"); !ok || k.IdleTimeout != 10*time.Minute {
		t.Fatalf("kind new = %+v, %v; want defaults applied", k, ok)
	}
	_, err = e.Acquire(context.Background(), Space{Host: "a.example.com", Kind: "old"})
	if !errors.Is(err, ErrUnknownKind) {
		t.Fatalf("Acquire of a removed kind: %v, want ErrUnknownKind", err)
	}
}

// TestEngineReadsItsClock: the times the engine records are its clock's (Config.Now),
// not the machine's: a space's since in Status, and the idle clock a release stamps.
func TestEngineReadsItsClock(t *testing.T) {
	at := time.Date(2031, 5, 4, 3, 2, 1, 0, time.UTC)
	e, _ := newCountingEngine(t, Config{Now: func() time.Time { return at }})
	defer e.Close()
	in := awakeNoProcess(e, "clock.example.com", time.Hour)
	in.mu.Lock()
	in.setStateLocked(StateSleeping)
	in.setStateLocked(StateAsleep)
	in.mu.Unlock()
	if st := e.Status(); len(st) != 1 || !st[0].Since.Equal(at) {
		t.Fatalf("status %+v, want since %v", st, at)
	}
	if in.lastUsed != at {
		t.Fatalf("last used %v, want %v", in.lastUsed, at)
	}
}
