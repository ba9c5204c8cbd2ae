package single

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	lspace "github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
)

func manifestGen(t *testing.T, bkt bucket.Bucket, host string) (int64, int64) {
	t.Helper()
	m, _, err := lspace.ReadManifest(context.Background(), bkt, host)
	if err != nil || m == nil {
		t.Fatalf("manifest of %s: %+v %v", host, m, err)
	}
	return m.Generation, m.RestoredFrom
}

// TestHistoryAndPointInTimeRestore: `lchat-caddy history` lists a real box's checkpoints,
// `lchat-caddy restore` is refused while the space is awake and, once it sleeps, brings back an
// earlier state as a new generation, which a second restore undoes.
func TestHistoryAndPointInTimeRestore(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{Idle: "1s"})
	const host = "pitr.example.com"
	createSpace(t, b, host)
	asleep := func() bool { st, _ := space(t, b, host); return st == "asleep" }

	postMessage(t, b, host, "first")
	harness.WaitFor(t, 30*time.Second, "space asleep", asleep)
	first, _ := manifestGen(t, e.bkt, host)
	postMessage(t, b, host, "second")
	harness.WaitFor(t, 30*time.Second, "space asleep", asleep)

	out, err := b.CLI("history", host, "--json")
	if err != nil {
		t.Fatalf("history: %v %s", err, out)
	}
	var hist struct {
		Checkpoints []lspace.Checkpoint `json:"checkpoints"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &hist); err != nil || len(hist.Checkpoints) < 2 {
		t.Fatalf("history = %s (%v), want at least two checkpoints", out, err)
	}
	found := false
	for _, cp := range hist.Checkpoints {
		found = found || cp.Generation == first && cp.Size > 0 && !cp.At.IsZero()
	}
	if !found {
		t.Fatalf("history lacks generation %d: %s", first, out)
	}
	if table, err := b.CLI("history", host); err != nil || !strings.Contains(table, "GENERATION") || !strings.Contains(table, fmt.Sprint(first)) {
		t.Fatalf("history table: %v %s", err, table)
	}

	// Awake: refused, and no restore happens.
	postMessage(t, b, host, "third")
	if out, err := b.CLI("restore", host, "--at", fmt.Sprint(first)); err == nil || !strings.Contains(out, "awake") {
		t.Fatalf("restore of an awake space: %v %s", err, out)
	}
	for _, bad := range []map[string]any{{"at": "yesterday"}, {"at": "0"}, {"at": 5}, {}} {
		if code, body, _ := b.Admin("POST", "/lchat/routes/"+host+"/restore", bad); code != http.StatusBadRequest {
			t.Fatalf("restore %v = %d %s, want 400", bad, code, body)
		}
	}
	harness.WaitFor(t, 30*time.Second, "space asleep", asleep)
	if _, from := manifestGen(t, e.bkt, host); from != 0 {
		t.Fatal("a refused restore changed the space")
	}
	if got := messages(t, b, host); !strings.Contains(got, "third") {
		t.Fatalf("after the refused restore the space lost a message: %s", got)
	}
	harness.WaitFor(t, 30*time.Second, "space asleep", asleep)

	out, err = b.CLI("restore", host, "--at", fmt.Sprint(first))
	if err != nil || !strings.Contains(out, "restored "+host) {
		t.Fatalf("restore: %v %s", err, out)
	}
	restored, from := manifestGen(t, e.bkt, host)
	if from != first {
		t.Fatalf("manifest restored_from = %d, want %d", from, first)
	}
	if got := messages(t, b, host); !strings.Contains(got, "first") || strings.Contains(got, "second") || strings.Contains(got, "third") {
		t.Fatalf("after restoring generation %d the space holds %s", first, got)
	}
	harness.WaitFor(t, 30*time.Second, "space asleep", asleep)
	// Undo: the generation before the restore.
	if out, err := b.CLI("restore", host, "--at", fmt.Sprint(restored-1)); err != nil {
		t.Fatalf("undo: %v %s", err, out)
	}
	if got := messages(t, b, host); !strings.Contains(got, "third") {
		t.Fatalf("after undoing the restore the space holds %s", got)
	}
}

// TestGCBesideRealWakes: garbage collections with no grace period, run while a real box wakes,
// writes and checkpoints a space over and over, never delete what the box or a later wake
// needs.
func TestGCBesideRealWakes(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{Idle: "1s", Replication: "300ms"})
	const host = "gc.example.com"
	createSpace(t, b, host)
	asleep := func() bool { st, _ := space(t, b, host); return st == "asleep" }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var collections, deleted atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			st, err := lspace.Collect(ctx, e.bkt, host, time.Nanosecond, 0, nil)
			if err == nil {
				collections.Add(1)
				deleted.Add(int64(st.Deleted))
			} else if ctx.Err() == nil {
				t.Errorf("collect: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	var want []string
	// More generations than GC always keeps (16), so older ones really expire.
	for i := range 8 {
		for j := range 3 {
			msg := fmt.Sprintf("round %d message %d", i, j)
			postMessage(t, b, host, msg)
			want = append(want, msg)
			time.Sleep(400 * time.Millisecond) // a periodic checkpoint while awake
		}
		harness.WaitFor(t, 30*time.Second, "space asleep", asleep)
	}
	cancel()
	<-done
	hist, _, _ := lspace.History(context.Background(), e.bkt, host)
	t.Logf("%d collections deleted %d objects; %d history entries left", collections.Load(), deleted.Load(), len(hist))
	if collections.Load() == 0 || deleted.Load() == 0 {
		t.Fatalf("%d collections deleted %d objects: GC never ran for real", collections.Load(), deleted.Load())
	}
	got := messages(t, b, host)
	for _, m := range want {
		if !strings.Contains(got, m) {
			t.Fatalf("after GC the space lacks %q: %s", m, got)
		}
	}
	if msgs := bucketMessages(t, e.bkt, host); len(msgs) < len(want) {
		t.Fatalf("the bucket's checkpoint restores %d messages, want %d", len(msgs), len(want))
	}
}
