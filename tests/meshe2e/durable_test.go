package meshe2e

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestAcknowledgedWritesSurviveTheHolder is the measurement as a test: three
// boxes, the demo room awake on one with durability bucket and no checkpoint while it
// runs (replication sleep), messages posted through another box, each answered 201, then
// a kill -9 of the room's box right after the last answer. Once the room is served again
// by a survivor (it wakes from the manifest and the log in the bucket), every message
// answered 201 is there, and the next message's id follows them: none is reused.
//
// LCHAT_DURABILITY_TEST_KIND=checkpoint runs it on a checkpoint kind instead, which loses
// them (what the test would see without the log).
func TestAcknowledgedWritesSurviveTheHolder(t *testing.T) {
	durability := "bucket"
	if k := os.Getenv("LCHAT_DURABILITY_TEST_KIND"); k != "" {
		durability = k
	}
	c := newCluster(t)
	c.kind = map[string]any{"durability": durability, "replication": map[string]any{"class": "sleep"}}
	a, b, cc := c.start(false), c.start(false), c.start(false)
	harness.WaitFor(t, 15*time.Second, "three live members", func() bool { return len(status(t, a).Mesh.Live) == 3 })
	host := hostOwnedBy(t, "durable", b, a, b, cc)
	c.createSpace(a, host)
	harness.WaitFor(t, 5*time.Second, "the row on every box", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })

	const writers, each = 8, 25 // 200 messages, 8 at a time
	var mu sync.Mutex
	var acked []string
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				text := fmt.Sprintf("w%d-m%d", w, i)
				code, body, err := c.do(a, "POST", host, "/api/messages", fmt.Sprintf(`{"author":"test","text":%q}`, text), nil)
				if err != nil || code != 201 {
					t.Errorf("posting %s: %d %v %.200s", text, code, err, body)
					continue
				}
				mu.Lock()
				acked = append(acked, text)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if got := awakeOn(t, host, a, b, cc); len(got) != 1 || got[0] != b.self {
		t.Fatalf("%s awake on %v, want %s", host, got, b.self)
	}
	// The operator sees the log: its segments in the status and the metrics.
	st := status(t, b)
	var lg struct {
		Segments uint64 `json:"segments"`
	}
	if err := json.Unmarshal([]byte(st.logOf(host)), &lg); durability == "bucket" && (err != nil || lg.Segments == 0) {
		t.Errorf("%s's status shows no log for %s: %q", b.self, host, st.logOf(host))
	}
	if code, metrics, err := b.Admin("GET", "/metrics", nil); err != nil || code != 200 {
		t.Errorf("GET /metrics: %d %v", code, err)
	} else if want := `lchat_log{figure="segments"}`; !strings.Contains(string(metrics), want) {
		t.Errorf("Prometheus metrics lack %s", want)
	}
	t.Logf("%d messages answered 201; the room's log on %s: %s", len(acked), b.self, st.logOf(host))
	b.Kill()

	var got map[string]int64
	var code int
	harness.WaitFor(t, deadAfter+30*time.Second, "the room served again after the kill", func() bool {
		got, code, _ = c.roomTexts(a, host)
		return code == 200
	}, func() string { return fmt.Sprintf("last status %d", code) })
	if lost := missing(acked, got); len(lost) > 0 {
		t.Fatalf("%d of %d messages answered 201 are gone after the holder's kill (durability %s)", len(lost), len(acked), durability)
	}
	var maxID int64
	for _, id := range got {
		maxID = max(maxID, id)
	}
	// The next message's id is new: a held event stream resuming after the last id it
	// saw never skips a real message.
	var next struct {
		ID int64 `json:"id"`
	}
	if err := json.Unmarshal([]byte(c.mustDo(a, "POST", host, "/api/messages", `{"author":"test","text":"after the kill"}`, 201)), &next); err != nil {
		t.Fatal(err)
	}
	if next.ID <= maxID {
		t.Fatalf("the message after the kill got id %d, at or below the last acknowledged one's %d", next.ID, maxID)
	}
	t.Logf("all %d acknowledged messages kept; the room now on %v", len(acked), awakeOn(t, host, a, cc))
}

// logOf is host's log and gate as the box reports them (engine.DurableStatus), "" when it
// reports none.
func (st boxStatus) logOf(host string) string {
	for _, s := range st.Spaces {
		if s.Host == host {
			return string(s.Log)
		}
	}
	return ""
}
