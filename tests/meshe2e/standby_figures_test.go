package meshe2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestStandbyFailoverFigures prints the failover time of a space after a kill -9 of its
// holder, durability standby against bucket: two boxes, the space awake on one (the
// holder) and, for standby, streaming to the other, which keeps the space's checkpoint
// warm (the kill waits for it); three rows posted through the other
// box (the entry box), the holder killed with -9 right after the last answer, and the time
// from the kill to the first GET answered 200 through the entry box. The killed box is
// started again (its directory kept) and the next run kills whichever box holds the space
// then. p50 and p99 of N runs for each of:
//
//   - durability standby and bucket;
//   - dead_after at the harness default (3 s) and at 30 s;
//   - a space of about 1 MB and one of about 200 MB: the durable_walapp's database beside a
//     SQLite table of random blobs (big.db, made by the kind's command at the space's
//     first wake and in the bucket by its first checkpoint), which a takeover restores
//     from the bucket (bucket) or finds warm (standby).
//
// Every run also checks that the rows answered 201 before the kill are there after it.
// Opt-in: each case takes N runs of a few seconds (bucket at 30 s: over 30 s each).
//
//	LCHAT_STANDBY_FAILOVER_RUNS=20 go test ./tests/meshe2e -run TestStandbyFailoverFigures -v -timeout 60m
//
// A subtest's name selects a case: -run 'TestStandbyFailoverFigures/standby/dead_after=3s/'.
func TestStandbyFailoverFigures(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("LCHAT_STANDBY_FAILOVER_RUNS"))
	if runs < 1 {
		t.Skip("the failover figures: LCHAT_STANDBY_FAILOVER_RUNS=20 (TestStandbyTakesOverBeforeDeadAfter is their CI form)")
	}
	walapp := harness.Program(t, "lchat-test-durable-walapp", "./tests/meshe2e/durable_walapp")
	var report strings.Builder
	defer func() { t.Log("\n" + report.String()) }()
	fmt.Fprintf(&report, "failover after a kill -9 of the holder, %d runs each, two boxes, load average at the start %s, %d CPUs\n",
		runs, loadavg(), runtime.NumCPU())
	fmt.Fprintf(&report, "  %-10s %-12s %-10s %-10s %-10s %-10s %s\n", "durability", "dead_after", "space", "p50", "p99", "max", "runs (ms)")
	for _, durability := range []string{"standby", "bucket"} {
		for _, da := range []time.Duration{deadAfter, 30 * time.Second} {
			for _, size := range []struct {
				name string
				rows int // big.db: rows of a 4 KB random blob
			}{{"1MB", 250}, {"200MB", 50000}} {
				t.Run(fmt.Sprintf("%s/dead_after=%v/%s", durability, da, size.name), func(t *testing.T) {
					took, bytes := failovers(t, runs, durability, da, walapp, size.rows)
					fmt.Fprintf(&report, "  %-10s %-12v %-10s %-10s %-10s %-10s %s (space %.1f MB)\n", durability, da, size.name,
						took[len(took)/2].Round(time.Millisecond), took[min(len(took)-1, len(took)*99/100)].Round(time.Millisecond),
						took[len(took)-1].Round(time.Millisecond), msList(took), float64(bytes)/1e6)
				})
			}
		}
	}
	fmt.Fprintf(&report, "load average at the end %s\n", loadavg())
}

// failovers runs one case: runs kills of the space's holder, and returns the times from a
// kill to the first 200 through the other box, sorted, and the space's size.
func failovers(t *testing.T, runs int, durability string, da time.Duration, walapp string, bigRows int) ([]time.Duration, int64) {
	c := newCluster(t)
	c.mesh = map[string]any{"dead_after": da.String()}
	// The kind's command makes big.db at the space's first wake (a restored space has it),
	// then runs the walapp.
	script := fmt.Sprintf(`f="$LCHAT_DATA_DIR/big.db"; [ -f "$f" ] || sqlite3 "$f" "CREATE TABLE big (b BLOB); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < %d) INSERT INTO big SELECT randomblob(4000) FROM n;" || exit 1; exec %s`, bigRows, walapp)
	c.kind = map[string]any{
		"durability": durability, "command": "/bin/sh", "args": []string{"-c", script},
		"ready_path": "/healthz", "ready_timeout": "5m",
	}
	a, b := c.start(false), c.start(false)
	nodes := []*node{a, b}
	harness.WaitFor(t, 15*time.Second, "two live members", func() bool { return len(status(t, a).Mesh.Live) == 2 })
	host := hostOwnedBy(t, "fig", b, a, b)
	c.createSpace(a, host)
	harness.WaitFor(t, 5*time.Second, "the row on the holder", func() bool { return hasRoute(b, host) })
	c.mustDo(a, "POST", host, "/rows", "first", http.StatusCreated)
	woke := time.Now()
	// big.db in the bucket: a checkpoint that started after the wake made it.
	var first time.Time
	harness.WaitFor(t, 5*time.Minute, "a checkpoint of the space with big.db", func() bool {
		ls := status(t, b).lastSync(host)
		if first.IsZero() && ls.After(woke) {
			first = ls
		}
		return !first.IsZero() && ls.After(first)
	})
	size := spaceSize(t, b, host)

	var took []time.Duration
	for run := range runs {
		holder, other := holderOf(t, host, nodes)
		// The rows first: a stream starts with the first write after a wake or a
		// checkpoint, and the standby watches a holder once it has a stream from it.
		var acked []string
		for i := range 3 {
			text := fmt.Sprintf("run%d-%d", run, i)
			c.mustDo(other, "POST", host, "/rows", text, http.StatusCreated)
			acked = append(acked, text)
		}
		if durability == "standby" {
			harness.WaitFor(t, 30*time.Second, "the standby watching the holder, its copy warm", func() bool {
				for _, f := range standbyFor(t, other) {
					if f.Host == host && f.Holder == holder.self && f.Watching && f.LastSeq > 0 && f.Warm {
						return standbyOf(t, holder, host).Box == other.self
					}
				}
				return false
			}, func() string {
				return fmt.Sprintf("the holder's stream %+v; the standby's spool %+v", standbyOf(t, holder, host), standbyFor(t, other))
			})
		}
		holder.Kill()
		var got map[string]bool
		d := harness.WaitFor(t, da+3*time.Minute, "the space served through the other box", func() bool {
			var code int
			got, code = c.rowTexts(other, host)
			return code == http.StatusOK
		})
		took = append(took, d)
		t.Logf("run %d: %s killed, served through %s %v after the kill", run+1, holder.self, other.self, d.Round(time.Millisecond))
		if lost := missing(acked, got); len(lost) > 0 {
			t.Fatalf("run %d: %d of %d rows answered 201 before the kill are gone: %v", run+1, len(lost), len(acked), lost)
		}
		holder.Start()
		harness.WaitFor(t, 30*time.Second, "the killed box live again", func() bool {
			return len(status(t, other).Mesh.Live) == 2 && len(status(t, holder).Mesh.Live) == 2
		})
	}
	slices.Sort(took)
	return took, size
}

// holderOf is the box host is awake on and the other one, once it is awake on exactly one.
func holderOf(t *testing.T, host string, nodes []*node) (holder, other *node) {
	t.Helper()
	harness.WaitFor(t, 30*time.Second, host+" awake on one box", func() bool { return len(awakeOn(t, host, nodes...)) == 1 })
	if status(t, nodes[0]).awake(host) {
		return nodes[0], nodes[1]
	}
	return nodes[1], nodes[0]
}

// rowTexts reads the walapp's rows through n: the set of their texts, and the read's
// status (200 when the set is filled).
func (c *cluster) rowTexts(n *node, host string) (map[string]bool, int) {
	code, body, err := c.do(n, "GET", host, "/rows", "", nil)
	if err != nil || code != http.StatusOK {
		return nil, code
	}
	var rows []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal([]byte(body), &rows) != nil {
		return nil, 0
	}
	out := make(map[string]bool, len(rows))
	for _, r := range rows {
		out[r.Text] = true
	}
	return out, code
}

// spaceSize is host's size as n reports it (its files at its last wake or checkpoint).
func spaceSize(t *testing.T, n *node, host string) int64 {
	var st struct {
		Spaces []struct {
			Host string `json:"host"`
			Size int64  `json:"size"`
		} `json:"spaces"`
	}
	n.AdminJSON("GET", "/lchat/status", nil, 200, &st)
	for _, s := range st.Spaces {
		if s.Host == host {
			return s.Size
		}
	}
	return 0
}

func msList(v []time.Duration) string {
	var parts []string
	for _, d := range v {
		parts = append(parts, strconv.FormatInt(d.Milliseconds(), 10))
	}
	return strings.Join(parts, " ")
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}
