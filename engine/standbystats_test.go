package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestNoteTakeoverCountsAndTells: each takeover a box notes is counted (failures apart),
// listed newest first up to recentTakeovers, and told to the engine's observers with its
// duration, holder and why: what the metrics' histogram and the console's event list read.
func TestNoteTakeoverCountsAndTells(t *testing.T) {
	e := newStandbyFleet(t, "box-a").engines["box-a"]
	var mu sync.Mutex
	var evs []Event
	defer e.Observe(func(ev Event) {
		mu.Lock()
		evs = append(evs, ev)
		mu.Unlock()
	})()
	const n = recentTakeovers + 4
	for i := range n {
		tk := Takeover{Host: fmt.Sprintf("s%d.example.com", i), Holder: "box-b", Why: "its address refuses connections", Took: time.Duration(i+1) * 100 * time.Millisecond}
		if i == 2 {
			tk.Err = "sealing the stream on the standby box-a: boom"
		}
		e.NoteTakeover(tk)
	}
	tot := e.StandbyTotals()
	if tot.Takeovers != n || tot.TakeoverFailures != 1 || len(tot.Recent) != recentTakeovers {
		t.Fatalf("totals %+v: want %d takeovers, 1 failed, the last %d listed", tot, n, recentTakeovers)
	}
	if tot.Recent[0].Host != fmt.Sprintf("s%d.example.com", n-1) || tot.Recent[0].At.IsZero() || tot.Recent[0].Took != n*100*time.Millisecond {
		t.Fatalf("newest takeover %+v: want s%d, stamped, with its duration", tot.Recent[0], n-1)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(evs) != n {
		t.Fatalf("%d events, want %d", len(evs), n)
	}
	ev := evs[2]
	if ev.Type != EventTakeover || ev.Host != "s2.example.com" || ev.Duration != 300*time.Millisecond || ev.Err == "" ||
		!strings.Contains(ev.Reason, "from box-b (its address refuses connections) in 300ms") {
		t.Fatalf("event %+v: want the failed takeover of s2 with its holder, why and duration", ev)
	}
	// Another engine's totals are its own.
	if other := newStandbyFleet(t, "box-c").engines["box-c"].StandbyTotals(); other.Takeovers != 0 || other.Recent != nil {
		t.Fatalf("a new engine's totals: %+v", other)
	}
}

// TestStreamStatusOfAnAwakeSpace: an awake space of standby durability shows its stream
// (the generation it streams, nothing left in flight once its answer was acknowledged); a
// checkpoint kind's space has none.
func TestStreamStatusOfAnAwakeSpace(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	ctx := context.Background()
	f := newStandbyFleet(t, "box-a", "box-b")
	a := f.engines["box-a"]
	const host, ckpt = "stream.example.com", "ckpt.example.com"
	if _, ok := a.StreamStatus(host); ok {
		t.Fatal("a stream for a space not awake")
	}
	wake(t, a, host).acknowledged(createM)
	st, ok := a.StreamStatus(host)
	log := logStatusOf(t, a, host)
	if !ok || st.Gen != log.Generation || st.Landing != 0 || log.Standby == nil || log.Standby.Box != "box-b" || log.Standby.Sent == 0 {
		t.Fatalf("stream %+v (ok %v), log %+v standby %+v: want box-b holding the acknowledged segment", st, ok, log, log.Standby)
	}
	if tot := a.StandbyTotals(); tot.Streamed == 0 {
		t.Fatalf("totals %+v: the segment the standby took is not counted", tot)
	}
	uc, err := a.Acquire(ctx, Space{Host: ckpt, Kind: "ckpt"})
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Release()
	if _, ok := a.StreamStatus(ckpt); ok {
		t.Fatal("a checkpoint kind's space has a stream")
	}
}
