package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/spacestore"
)

// putLease writes host's lease as another box would, unconditionally.
func putLease(t *testing.T, b bucket.Bucket, host string, l spacestore.Lease) {
	t.Helper()
	body, _ := json.Marshal(l)
	if _, err := b.Put(context.Background(), spacestore.LeaseKey(host), bytes.NewReader(body), int64(len(body)), bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseInFlightWhileTheInstanceStarts: a wake's instance is started while its lease
// write is in flight (the lease does not wait in front of the restore and start), and when
// the lease turns out held by a live other box the instance is ended before the wake
// returns, nothing is proxied to it, and what it wrote into the data dir as it started is
// not kept: the next wake serves the bucket's state. A checkpoint kind: a kind whose
// durability is bucket starts its instance only once the lease and fence are written and
// the log sealed after them.
func TestLeaseInFlightWhileTheInstanceStarts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	e, c := forgetTestEngine(t, checkpointKinds, func(cfg *Config) {
		cfg.HolderLive = func(holder, _ string) bool { return holder == "other" }
		k := cfg.Kinds["app"]
		k.Env = map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1", "START_NOTE": "1"}
		cfg.Kinds["app"] = k
	})
	ctx := context.Background()
	sp := Space{Host: "lease-overlap.example.com", Kind: "app"}
	u, err := e.Acquire(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	post(t, u, "/saved")
	u.Release()
	if err := e.Sleep(ctx, sp.Host); err != nil {
		t.Fatal(err)
	}
	saved := savedNotes(t, c.Bucket, sp.Host)
	if !strings.HasSuffix(saved, "/saved\n") {
		t.Fatalf("bucket holds %q", saved)
	}
	in := e.lookup(sp.Host)
	notes := filepath.Join(in.dataDir, "notes.txt")

	var armed atomic.Bool
	armed.Store(true)
	var ranPID atomic.Int64
	c.SetFail(func(ctx context.Context, op membucket.Op, key string) error {
		if op != membucket.OpPut || !strings.HasSuffix(key, "/lease") || !armed.Swap(false) {
			return nil
		}
		// The lease write waits for the instance to have started and changed its data
		// dir: a wake that writes the lease before it starts the instance never gets
		// there.
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			in.mu.Lock()
			p := in.proc
			in.mu.Unlock()
			if p == nil {
				continue
			}
			if data, _ := os.ReadFile(notes); strings.Contains(string(data), fmt.Sprintf("start %d\n", p.pid)) {
				ranPID.Store(int64(p.pid))
				break
			}
		}
		// Meanwhile a live other box took the space.
		putLease(t, c.Bucket, sp.Host, spacestore.Lease{Holder: "other", Incarnation: "9", AcquiredAt: time.Now()})
		return nil
	})
	_, err = e.Acquire(ctx, sp)
	c.SetFail(nil)
	var held *LeaseHeldError
	if !errors.As(err, &held) || held.Holder != "other" {
		t.Fatalf("wake under another box's lease: %v, want LeaseHeldError naming other", err)
	}
	pid := int(ranPID.Load())
	if pid == 0 {
		t.Fatal("the lease was written before the instance started")
	}
	if !procGone(pid) {
		t.Fatalf("the instance started under the refused lease (%d) still runs", pid)
	}
	if st := stateOf(in); st != StateAsleep {
		t.Fatalf("after the refused lease the space is %s, want asleep", st)
	}
	if got := savedNotes(t, c.Bucket, sp.Host); got != saved {
		t.Fatalf("bucket changed to %q under the refused lease", got)
	}

	// The other box lets go; the next wake serves the bucket's state, without the line
	// the ended instance wrote.
	putLease(t, c.Bucket, sp.Host, spacestore.Lease{Holder: "other", Incarnation: "9", AcquiredAt: time.Now(), Released: true})
	u, err = e.Acquire(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Release()
	data, err := os.ReadFile(notes)
	if err != nil {
		t.Fatal(err)
	}
	if want := saved + fmt.Sprintf("start %d\n", u.pid); string(data) != want {
		t.Fatalf("data dir after the next wake holds %q, want %q (the bucket's state and this start)", data, want)
	}
}

// TestRefusedLeaseEvictsNobody: under max_awake, a wake whose lease is still in flight
// takes only free room; when room means sleeping another space, it waits for its lease
// first, so a refused lease leaves the idle awake space awake.
func TestRefusedLeaseEvictsNobody(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	e, c := forgetTestEngine(t, func(cfg *Config) {
		cfg.MaxAwake = 1
		cfg.HolderLive = func(holder, _ string) bool { return holder == "other" }
	})
	ctx := context.Background()
	a := Space{Host: "idle.example.com", Kind: "app"}
	b := Space{Host: "taken.example.com", Kind: "app"}
	u, err := e.Acquire(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	u.Release()
	putLease(t, c.Bucket, b.Host, spacestore.Lease{Holder: "other", Incarnation: "9", AcquiredAt: time.Now()})
	_, err = e.Acquire(ctx, b)
	var held *LeaseHeldError
	if !errors.As(err, &held) {
		t.Fatalf("wake of a space another box holds: %v, want LeaseHeldError", err)
	}
	if st := stateOf(e.lookup(a.Host)); st != StateAwake {
		t.Fatalf("the idle space is %s after a wake that was refused its lease, want awake", st)
	}
}

// TestWakeAfterSleepTakesLeaseInOneRequest: a wake of a space this box put to sleep takes
// the lease it released with one conditional write, not a failed create, a read and a
// swap (on S3 each is a round trip of the wake).
func TestWakeAfterSleepTakesLeaseInOneRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	e, c := forgetTestEngine(t)
	ctx := context.Background()
	sp := Space{Host: "lease-once.example.com", Kind: "app"}
	u, err := e.Acquire(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	u.Release()
	if err := e.Sleep(ctx, sp.Host); err != nil {
		t.Fatal(err)
	}
	var leaseOps atomic.Int32
	c.SetFail(func(ctx context.Context, op membucket.Op, key string) error {
		if strings.HasSuffix(key, "/lease") {
			leaseOps.Add(1)
		}
		return nil
	})
	u, err = e.Acquire(ctx, sp)
	c.SetFail(nil)
	if err != nil {
		t.Fatal(err)
	}
	u.Release()
	if n := leaseOps.Load(); n != 1 {
		t.Fatalf("the wake made %d lease requests, want 1", n)
	}
}
