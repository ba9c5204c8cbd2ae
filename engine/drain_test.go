package engine

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

// TestQuiesceEndsWithTheLastUse: a drain's wait for the requests already in a space ends
// the moment the last of them is released, not at a poll after it, and gives up at
// drainUseGrace on one that is never released; meanwhile no new request gets the space.
func TestQuiesceEndsWithTheLastUse(t *testing.T) {
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
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel() // ends a wait a failed test leaves behind
		acquire := func(host string) *Use {
			t.Helper()
			u, err := e.Acquire(ctx, Space{Host: host, Kind: "app"})
			if err != nil {
				t.Fatal(err)
			}
			return u
		}

		in := awakeNoProcess(e, "q.example.com", time.Hour)
		u1, u2 := acquire(in.host), acquire(in.host)
		start := time.Now()
		took := make(chan time.Duration, 1)
		go func() {
			e.quiesce(ctx, in)
			took <- time.Since(start)
		}()
		synctest.Wait()
		if _, err := e.Acquire(ctx, Space{Host: in.host, Kind: "app"}); !errors.Is(err, ErrDraining) {
			t.Fatalf("a request while the space quiesces: %v, want ErrDraining", err)
		}
		time.Sleep(time.Second)
		u1.Release()
		synctest.Wait()
		select {
		case d := <-took:
			t.Fatalf("the wait ended after %v with a use still out", d)
		default:
		}
		u2.Release()
		synctest.Wait()
		select {
		case d := <-took:
			if d != time.Second {
				t.Fatalf("the wait ended %v after it began, want 1s: the moment the last use was released", d)
			}
		default:
			t.Fatal("still waiting after the last use was released")
		}

		stuck := awakeNoProcess(e, "stuck.example.com", time.Hour)
		u := acquire(stuck.host)
		start = time.Now()
		e.quiesce(ctx, stuck)
		if d := time.Since(start); d != drainUseGrace {
			t.Fatalf("a use never released held the wait %v, want drainUseGrace (%v)", d, drainUseGrace)
		}
		u.Release()
	})
}
