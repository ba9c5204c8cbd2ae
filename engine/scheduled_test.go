package engine

import (
	"context"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/internal/testwait"
	"github.com/lchat/lchat-caddy/spacestore"
)

// TestScanTellsOwnsHowLate: Config.Owns is asked with how late each due wake is, so a box
// may fire a wake it does not place once the wake is overdue (mesh.Node.FiresWake): a
// wake an hour late fires, one due a moment ago is left for the box it is placed on.
func TestScanTellsOwnsHowLate(t *testing.T) {
	e, c := newCountingEngine(t, Config{
		WakeScanInterval: 10 * time.Millisecond,
		Resolve:          func(string) (Space, bool) { return Space{}, false },
		Owns:             func(host string, late time.Duration) bool { return late >= 30*time.Minute },
	})
	defer e.Close()
	now := time.Now()
	for h, at := range map[string]time.Time{"overdue.example.com": now.Add(-time.Hour), "due.example.com": now.Add(-time.Second)} {
		if _, err := spacestore.PutWake(context.Background(), c, h, at); err != nil {
			t.Fatal(err)
		}
	}
	e.Start()
	testwait.WaitFor(t, 10*time.Second, "the overdue record fired (deleted: no route)", func() bool {
		_, ok := wakeRecord(t, c, "overdue.example.com")
		return !ok
	})
	lists := c.Counts()[membucket.OpList]
	testwait.WaitFor(t, 10*time.Second, "two more scans", func() bool { return c.Counts()[membucket.OpList] >= lists+2 })
	if _, ok := wakeRecord(t, c, "due.example.com"); !ok {
		t.Fatal("a wake not yet overdue fired on a box that does not place it")
	}
}

// TestFireWakeStopsWhenDeliveredElsewhere: two boxes may fire one wake; the one whose
// delivery failed stops retrying once the record is gone (the other delivered it) or
// replaced by a newer wake, instead of waking the space again later for a wake already
// delivered.
func TestFireWakeStopsWhenDeliveredElsewhere(t *testing.T) {
	for _, tc := range []struct {
		name   string
		settle func(c *membucket.Counting, host string) error
	}{
		{"deleted", func(c *membucket.Counting, host string) error {
			return spacestore.DeleteWake(context.Background(), c, host, "")
		}},
		{"replaced", func(c *membucket.Counting, host string) error {
			_, err := spacestore.PutWake(context.Background(), c, host, time.Now().Add(time.Hour))
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const host = "both.example.com"
			// Every delivery fails: the kind is not configured here.
			e, c := newCountingEngine(t, Config{Resolve: func(string) (Space, bool) { return Space{Host: host, Kind: "gone"}, true }})
			defer e.Close()
			if _, err := spacestore.PutWake(context.Background(), c, host, time.Now().Add(-time.Minute)); err != nil {
				t.Fatal(err)
			}
			recs, _, err := (&spacestore.WakeScanner{Bucket: c}).Scan(context.Background())
			if err != nil || len(recs) != 1 {
				t.Fatalf("scan: %v %v", recs, err)
			}
			if err := tc.settle(c, host); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { e.fireWake(e.ctx, recs[0]); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("fireWake still retrying a wake whose record is " + tc.name)
			}
		})
	}
}
