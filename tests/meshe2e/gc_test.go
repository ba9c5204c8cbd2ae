package meshe2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestGCBesideTwoBoxes: two real boxes on one versitygw wake, write, checkpoint and sleep
// their spaces at the same time, over and over, while garbage collections with no grace
// period and no retention run beside them; afterwards every message is still there, read
// by a wake that restores from the bucket, and the collections really deleted objects.
// The kind's gc_grace is set, so a real box also takes that option.
func TestGCBesideTwoBoxes(t *testing.T) {
	c := newCluster(t)
	c.kind = map[string]any{"idle_timeout": "1s", "gc_grace": "1s",
		"replication": map[string]any{"class": "periodic", "interval": "300ms"}}
	a, b := c.start(false), c.start(false)
	harness.WaitFor(t, 10*time.Second, "two live members", func() bool { return len(status(t, a).Mesh.Live) == 2 })
	hosts := map[*node]string{a: hostOwnedBy(t, "gca", a, a, b), b: hostOwnedBy(t, "gcb", b, a, b)}
	for _, h := range hosts {
		c.createSpace(a, h)
		harness.WaitFor(t, 5*time.Second, "row on the peer", func() bool { return hasRoute(b, h) })
	}
	bkt := c.s3.NewBucket(t, c.prefix)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var collections, deleted atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for _, h := range hosts {
				st, err := spacestore.Collect(ctx, bkt, h, time.Nanosecond, 0, nil)
				if err == nil {
					collections.Add(1)
					deleted.Add(int64(st.Deleted))
				} else if ctx.Err() == nil {
					t.Errorf("collect %s: %v", h, err)
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	want := map[string][]string{}
	// More generations than GC always keeps (16), so older ones really expire.
	for round := range 8 {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for owner, h := range hosts {
			via := a // each space is written through the other box: one hop to its owner
			if owner == a {
				via = b
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 3 {
					msg := fmt.Sprintf("%s round %d message %d", h, round, i)
					code, body, err := c.do(via, "POST", h, "/api/messages", fmt.Sprintf(`{"author":"gc","text":%q}`, msg), nil)
					if err != nil || code != 201 {
						t.Errorf("post to %s: %d %v %.200s", h, code, err, body)
						return
					}
					mu.Lock()
					want[h] = append(want[h], msg)
					mu.Unlock()
					time.Sleep(400 * time.Millisecond) // a periodic checkpoint while awake
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		for owner, h := range hosts {
			harness.WaitFor(t, 30*time.Second, h+" asleep", func() bool { return !status(t, owner).awake(h) })
		}
	}
	cancel()
	<-done
	t.Logf("%d collections deleted %d objects", collections.Load(), deleted.Load())
	if deleted.Load() == 0 {
		t.Fatalf("%d collections deleted nothing: GC never ran for real", collections.Load())
	}
	for _, h := range hosts {
		got := c.mustDo(a, "GET", h, "/api/messages?limit=1000", "", 200) // a wake: restored from the bucket
		for _, m := range want[h] {
			if !strings.Contains(got, m) {
				t.Fatalf("after GC %s lacks %q: %.500s", h, m, got)
			}
		}
	}
}
