package engine

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestObserverHearsWakePhasesAndCheckpoint: a real wake reports each phase (the start delay
// of the instance shows in ready, not in lease or restore), the sleep reports its reason,
// and the sleep's checkpoint its duration, bytes and the space's size; a cancelled observer
// hears nothing more.
func TestObserverHearsWakePhasesAndCheckpoint(t *testing.T) {
	const delay = 300 * time.Millisecond
	e := newAwakeTestEngine(t, delay)
	const host = "obs.example.com"
	var mu sync.Mutex
	var got []Event
	cancel := e.Observe(func(ev Event) {
		mu.Lock()
		got = append(got, ev)
		mu.Unlock()
	})
	var other int
	cancelOther := e.Observe(func(Event) { other++ })
	cancelOther()

	u, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"})
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(e.cfg.StateDir, "spaces", host, "data", "notes.txt")
	if err := os.WriteFile(data, []byte("twelve bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrote := time.Now() // what connhold's CheckpointCovered compares with Started
	u.Release()
	if err := e.Sleep(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"}); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	if other != 0 {
		t.Errorf("a cancelled observer heard %d events", other)
	}
	byType := map[string]Event{}
	var types []string
	for _, ev := range got {
		byType[ev.Type] = ev
		types = append(types, ev.Type)
		if ev.Host != host || ev.At.IsZero() {
			t.Errorf("event %+v: want host %s and a time", ev, host)
		}
	}
	if len(got) != 3 {
		t.Fatalf("events = %v, want wake, checkpoint, sleep", types)
	}
	w := byType[EventWake]
	if w.Err != "" || w.Phases.Ready < delay || w.Phases.Lease >= delay || w.Phases.Restore >= delay || w.Phases.Fence <= 0 || w.Phases.Fence >= delay || w.Phases.Start <= 0 {
		t.Errorf("wake phases %+v (err %q): want ready >= %v, lease, restore and fence below it", w.Phases, w.Err, delay)
	}
	if w.Phases.Total() != w.Phases.Lease+w.Phases.Restore+w.Phases.Fence+w.Phases.Start+w.Phases.Ready {
		t.Error("Total is not the sum of the phases")
	}
	c := byType[EventCheckpoint]
	if c.Err != "" || c.Bytes < 12 || c.Size < 12 || c.Duration <= 0 {
		t.Errorf("checkpoint %+v: want >= 12 bytes uploaded and size, a duration", c)
	}
	// Started is the checkpoint's start, which held the write: after it, and not after
	// the end minus the duration (stamped once the checkpoint had read the files).
	if !c.Started.After(wrote) || c.Started.After(c.At.Add(-c.Duration)) {
		t.Errorf("checkpoint started %v: want after the write (%v), not after its end %v minus its duration %v", c.Started, wrote, c.At, c.Duration)
	}
	if s := byType[EventSleep]; s.Reason != "requested" {
		t.Errorf("sleep reason %q, want requested", s.Reason)
	}
	if st := e.Status(); len(st) != 1 || st[0].Size != c.Size {
		t.Errorf("status size %+v, want %d", st, c.Size)
	}
}
