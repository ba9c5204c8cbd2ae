package engine

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

// awakeNoProcess makes host look awake with no process and no synced state, so the idle
// machinery (Acquire, Release, the idle timer, an idle sleep) runs without any I/O.
func awakeNoProcess(e *Engine, host string, idle time.Duration) *inst {
	in := e.get(host)
	in.mu.Lock()
	in.sp = Space{Host: host, Kind: "app"}
	in.kind = Kind{Name: "app", Command: "/bin/true", IdleTimeout: idle, StopGrace: time.Second}
	in.putLocked(StateAwake)
	in.gen++
	in.lastUsed = e.now()
	in.armIdleLocked()
	in.mu.Unlock()
	return in
}

func stateOf(in *inst) State {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.state
}

// TestIdleSleepFollowsLastUse: a space sleeps IdleTimeout after its last use is released,
// not before, however its uses come and go, and never while a use is held.
func TestIdleSleepFollowsLastUse(t *testing.T) {
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		e, err := New(Config{Bucket: b, StateDir: dir, Holder: "box", Incarnation: "1",
			Kinds: map[string]Kind{"app": {Command: "/bin/true"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		const idle = 10 * time.Minute
		acquire := func(host string) *Use {
			t.Helper()
			u, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"})
			if err != nil {
				t.Fatal(err)
			}
			return u
		}
		expect := func(in *inst, want State, when string) {
			t.Helper()
			synctest.Wait()
			if got := stateOf(in); got != want {
				t.Fatalf("%s: %s, want %s", when, got, want)
			}
		}

		// Used briefly in the middle of the first timeout: the timer that fires at 10m
		// finds it used at 7m and waits until 17m.
		a := awakeNoProcess(e, "a.example.com", idle)
		time.Sleep(5 * time.Minute)
		u := acquire("a.example.com")
		time.Sleep(2 * time.Minute)
		u.Release()
		time.Sleep(idle - time.Second) // 16m59s
		expect(a, StateAwake, "1s before 10m after the last release")
		time.Sleep(2 * time.Second)
		expect(a, StateAsleep, "10m after the last release")

		// Held across several timeouts: awake all along; asleep 10m after the release.
		c := awakeNoProcess(e, "c.example.com", idle)
		u = acquire("c.example.com")
		time.Sleep(35 * time.Minute)
		expect(c, StateAwake, "while a use is held")
		u.Release()
		u.Release() // idempotent
		time.Sleep(idle - time.Second)
		expect(c, StateAwake, "1s before 10m after the release")
		time.Sleep(2 * time.Second)
		expect(c, StateAsleep, "10m after the release")

		// Many short uses keep it awake; none of them creates a timer.
		d := awakeNoProcess(e, "d.example.com", idle)
		for range 30 {
			time.Sleep(time.Minute)
			acquire("d.example.com").Release()
		}
		expect(d, StateAwake, "used every minute")
		time.Sleep(idle + time.Second)
		expect(d, StateAsleep, "10m after the last of many uses")
	})
}

// TestAcquireReleaseAllocs: the request path's Acquire and Release of an awake space
// allocate the Use and nothing else (no timer per request).
func TestAcquireReleaseAllocs(t *testing.T) {
	e, _ := newCountingEngine(t, Config{})
	defer e.Close()
	awakeNoProcess(e, "a.example.com", time.Hour)
	sp := Space{Host: "a.example.com", Kind: "app"}
	ctx := context.Background()
	n := testing.AllocsPerRun(1000, func() {
		u, err := e.Acquire(ctx, sp)
		if err != nil {
			t.Fatal(err)
		}
		u.Release()
	})
	if n > 1 {
		t.Fatalf("Acquire+Release allocate %v times, want 1 (the Use)", n)
	}
}

// BenchmarkAcquireRelease is the engine's share of a request to an awake space.
func BenchmarkAcquireRelease(b *testing.B) {
	e, _ := newCountingEngine(b, Config{})
	defer e.Close()
	awakeNoProcess(e, "a.example.com", time.Hour)
	sp := Space{Host: "a.example.com", Kind: "app"}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			u, err := e.Acquire(ctx, sp)
			if err != nil {
				b.Fatal(err)
			}
			u.Release()
		}
	})
}
