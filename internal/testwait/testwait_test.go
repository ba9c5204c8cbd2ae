package testwait

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// fatalTB records what a test would have failed with; Fatal ends the calling goroutine
// as testing.T's does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatal(args ...any) {
	f.msg = args[0].(string)
	runtime.Goexit()
}

// waitIn runs WaitFor on its own goroutine (Fatal ends it) and returns what it failed
// with ("" when it returned) and its result.
func waitIn(timeout time.Duration, what string, cond func() bool, diag ...func() string) (string, time.Duration) {
	f := &fatalTB{}
	var took time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		took = WaitFor(f, timeout, what, cond, diag...)
	}()
	<-done
	return f.msg, took
}

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	msg, took := waitIn(time.Minute, "the third call", func() bool { return calls.Add(1) == 3 })
	if msg != "" {
		t.Fatalf("failed with %q", msg)
	}
	if calls.Load() != 3 {
		t.Errorf("cond asked %d times, want 3 (WaitFor stops asking once it holds)", calls.Load())
	}
	// Two waits on the curve: 1 ms then 2 ms, far below the cap.
	if took > time.Second {
		t.Errorf("took %v for a condition that held on the third call", took)
	}
}

func TestWaitForAsksAtLeastOnce(t *testing.T) {
	if msg, _ := waitIn(0, "a held condition", func() bool { return true }); msg != "" {
		t.Fatalf("a condition that holds at once failed with a zero timeout: %q", msg)
	}
}

func TestWaitForFailsWithWhatAndDiagnostics(t *testing.T) {
	var calls atomic.Int32
	msg, _ := waitIn(30*time.Millisecond, "the impossible", func() bool { calls.Add(1); return false },
		func() string { return "last status 503" }, func() string { return "b sees 2" })
	want := "timed out after 30ms waiting for the impossible; last status 503; b sees 2"
	if msg != want {
		t.Fatalf("failure %q, want %q", msg, want)
	}
	// At once, then 1, 2, 4, 8, 16 ms and the deadline: it polls, not just once at the end.
	if n := calls.Load(); n < 3 {
		t.Errorf("cond asked %d times in 30ms", n)
	}
}
