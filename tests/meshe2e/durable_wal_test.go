package meshe2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestWALRestartsUnderLoadLoseNothing: an instance that checkpoints its own SQLite WAL
// while writes flow (durable_walapp: every 8th insert a wal_checkpoint, in turn TRUNCATE,
// RESTART and PASSIVE, so the WAL the log shipper follows is cut to zero bytes, or
// rewritten from its start with new salts, between two of its segments) rides the log
// alone; 8 writers post 320 rows through the entry box, each answered 201; the holder is
// killed right after the last answer. The other box wakes the space from the manifest
// and the log: every row answered 201 is there, the database passes integrity_check, and
// the next row's id follows them.
func TestWALRestartsUnderLoadLoseNothing(t *testing.T) {
	c := newCluster(t)
	c.kind = logOnlyKind(map[string]any{
		"command": harness.Program(t, "lchat-test-durable-walapp", "./tests/meshe2e/durable_walapp"),
		"args":    []string{},
		"env":     map[string]string{"WALAPP_CHECKPOINT_EVERY": "8"},
	})
	a, b := c.start(false), c.start(false)
	harness.WaitFor(t, 15*time.Second, "two live members", func() bool { return len(status(t, a).Mesh.Live) == 2 })
	host := hostOwnedBy(t, "wal", b, a, b)
	c.createSpace(a, host)
	harness.WaitFor(t, 5*time.Second, "the row on the holder", func() bool { return hasRoute(b, host) })

	const writers, each = 8, 40
	var mu sync.Mutex
	acked := map[string]int64{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				text := fmt.Sprintf("w%d-r%d", w, i)
				code, body, err := c.do(a, "POST", host, "/rows", text, nil)
				var row struct {
					ID int64 `json:"id"`
				}
				if err != nil || code != http.StatusCreated || json.Unmarshal([]byte(body), &row) != nil {
					t.Errorf("posting %s: %d %v %.200s", text, code, err, body)
					continue
				}
				mu.Lock()
				acked[text] = row.ID
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if got := awakeOn(t, host, a, b); len(got) != 1 || got[0] != b.self {
		t.Fatalf("%s awake on %v, want %s", host, got, b.self)
	}
	// The instance did move its WAL: else the test proves nothing about it.
	var stats map[string]int
	if err := json.Unmarshal([]byte(c.mustDo(a, "GET", host, "/stats", "", http.StatusOK)), &stats); err != nil {
		t.Fatal(err)
	}
	if stats["TRUNCATE"] == 0 || stats["RESTART"] == 0 {
		t.Fatalf("the instance's own checkpoints: %v, want complete TRUNCATEs and RESTARTs", stats)
	}
	g, ok := gateOf(t, b, host)
	if !ok || g.Segments == 0 {
		t.Fatalf("%s ships no log for %s", b.self, host)
	}
	t.Logf("%d rows answered 201; the instance's checkpoints %v; %d segments", len(acked), stats, g.Segments)
	b.Kill()

	var code int
	var body string
	harness.WaitFor(t, deadAfter+30*time.Second, "the space served again after the kill", func() bool {
		code, body, _ = c.do(a, "GET", host, "/rows", "", nil)
		return code == http.StatusOK
	}, func() string { return fmt.Sprintf("last status %d", code) })
	var rows []struct {
		ID   int64  `json:"id"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		t.Fatalf("the rows: %v: %.300s", err, body)
	}
	have := make(map[string]int64, len(rows))
	var maxID int64
	for _, r := range rows {
		have[r.Text] = r.ID
		maxID = max(maxID, r.ID)
	}
	var lost []string
	for text, id := range acked {
		if got, ok := have[text]; !ok {
			lost = append(lost, text)
		} else if got != id {
			t.Errorf("%s: id %d after the kill, %d when answered", text, got, id)
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d of %d rows answered 201 are gone after the holder's kill: %v", len(lost), len(acked), lost)
	}
	if check := c.mustDo(a, "GET", host, "/check", "", http.StatusOK); check != "ok" {
		t.Fatalf("integrity_check after the kill: %q", check)
	}
	var next struct {
		ID int64 `json:"id"`
	}
	if err := json.Unmarshal([]byte(c.mustDo(a, "POST", host, "/rows", "after the kill", http.StatusCreated)), &next); err != nil {
		t.Fatal(err)
	}
	if next.ID <= maxID {
		t.Fatalf("the row after the kill got id %d, at or below the last one's %d", next.ID, maxID)
	}
	t.Logf("all %d rows kept, integrity ok, the next id %d", len(acked), next.ID)
}
