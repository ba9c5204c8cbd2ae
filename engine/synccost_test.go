package engine

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
)

// TestPeriodicSyncOfUnchangedSpaceCostsNothing counts the bucket requests of the periodic
// sync: an awake space whose files did not change costs none at all (the snapshot is
// compared with the last manifest locally), so a box's bucket requests per hour do not
// grow with the number of awake, unchanged spaces. A change costs a fixed few: one HEAD
// and one PUT per new blob, one PUT of the manifest.
func TestPeriodicSyncOfUnchangedSpaceCostsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fb, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	counted := membucket.NewCounting(fb)
	dir, err := os.MkdirTemp("", "eng")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	e, err := New(Config{
		Bucket: counted, StateDir: dir, Holder: "box", Incarnation: "1",
		Kinds: map[string]Kind{"app": {
			Command:     self,
			Env:         map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
			Replication: Replication{Class: ReplicatePeriodic, Interval: 50 * time.Millisecond},
			IdleTimeout: time.Hour,
			StopGrace:   5 * time.Second,
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		e.Drain(ctx)
		e.Close()
	}()

	const spaces = 5
	var uses []*Use
	for i := 0; i < spaces; i++ {
		u, err := e.Acquire(context.Background(), Space{Host: fmt.Sprintf("s%d.example.com", i), Kind: "app"})
		if err != nil {
			t.Fatal(err)
		}
		defer u.Release()
		uses = append(uses, u)
	}
	post := func(u *Use, path string) {
		t.Helper()
		c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", u.Socket())
		}}}
		defer c.CloseIdleConnections()
		resp, err := c.Post("http://instance"+path, "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for i, u := range uses {
		post(u, "/first-"+strconv.Itoa(i))
	}
	// syncsSeen waits until every space has completed n more checkpoints (LastSync moves
	// on each successful one, written or not).
	syncsSeen := func(n int) {
		t.Helper()
		last := map[string]time.Time{}
		seen := map[string]int{}
		deadline := time.Now().Add(30 * time.Second)
		for {
			done := 0
			for _, st := range e.Status() {
				if !st.LastSync.IsZero() && !st.LastSync.Equal(last[st.Host]) {
					last[st.Host] = st.LastSync
					seen[st.Host]++
				}
				if seen[st.Host] > n {
					done++
				}
			}
			if done == spaces {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("syncs seen %v, want %d each", seen, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	syncsSeen(1) // the first writes are in the bucket
	counted.Reset()
	syncsSeen(10)
	if n := counted.Total(); n != 0 {
		t.Fatalf("%d spaces x 10 periodic syncs of unchanged data: %d bucket requests %v, want 0", spaces, n, counted.Counts())
	}
	t.Logf("FIGURE %d awake unchanged spaces x 10 periodic syncs: 0 bucket requests", spaces)

	syncsBefore := e.Counters().Syncs
	post(uses[0], "/second")
	deadline := time.Now().Add(30 * time.Second)
	for e.Counters().Syncs == syncsBefore {
		if time.Now().After(deadline) {
			t.Fatal("the change was never synced")
		}
		time.Sleep(5 * time.Millisecond)
	}
	syncsSeen(2) // let any follow-up sync finish too
	c := counted.Counts()
	// Format 2: the new chunk (never a HEAD first: an object is reused only when the
	// manifest references it), the manifest, its history entry.
	if c[membucket.OpPut] != 3 || counted.Total() != 3 {
		t.Fatalf("one changed file in one space: %v, want PUT 3 (chunk, manifest, history)", c)
	}
	t.Logf("FIGURE one changed file: %v", c)
}
