package console

import (
	"context"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

// TestMain doubles as an instance (boxtest.RunInstance) for the boxes the tests open.
func TestMain(m *testing.M) {
	boxtest.RunInstance()
	os.Exit(m.Run())
}

// openBox opens a box on bkt whose demo kind runs this test binary as its instance, with
// the route host.
func openBox(t *testing.T, bkt *membucket.Bucket, host string) *box.Box {
	t.Helper()
	b := boxtest.Open(t, boxtest.Options{Bucket: bkt, Settings: box.Settings{Kinds: boxtest.InstanceKinds(t)}})
	if _, err := b.Create(context.Background(), registry.Spec{Host: host, Kind: "demo"}); err != nil {
		t.Fatal(err)
	}
	return b
}

// A checkpoint that uploaded nothing (a periodic one of a space nobody wrote to) is not an
// event: the list keeps the wakes, sleeps and checkpoints that saved something.
func TestQuietCheckpointsAreNotEvents(t *testing.T) {
	const host = "a.example.com"
	b := openBox(t, membucket.New(), host)
	h := newHandler(b.Console(), nil)
	cancel := b.Console().Subscribe(h.rec.Record)
	defer cancel()
	var quiet, saved int
	stop := b.Engine().Observe(func(ev engine.Event) {
		if ev.Type == engine.EventCheckpoint && ev.Err == "" {
			if ev.Bytes == 0 {
				quiet++
			} else {
				saved++
			}
		}
	})
	defer stop()

	boxtest.Wake(t, b, host) // writes a note: the first checkpoint saves it
	ctx := context.Background()
	b.Engine().CheckpointNow(ctx, host)
	b.Engine().CheckpointNow(ctx, host) // nothing changed since
	stop()
	if saved != 1 || quiet != 1 {
		t.Fatalf("the engine made %d checkpoints that saved something and %d that saved nothing; want one of each", saved, quiet)
	}
	var ckpts []fleetview.Event
	for _, ev := range h.rec.Events(0, 0) {
		if ev.Type == fleetview.EventCheckpoint {
			ckpts = append(ckpts, ev)
		}
	}
	if len(ckpts) != 1 || strings.Contains(ckpts[0].Detail, " 0 bytes uploaded") {
		t.Fatalf("checkpoint events %+v; want the one that uploaded the note", ckpts)
	}
	if body := serve(h, httptest.NewRequest("GET", "/", nil)).Body.String(); strings.Count(body, `class="ev ev-checkpoint"`) != 1 {
		t.Fatalf("the page lists %d checkpoints, want 1", strings.Count(body, `class="ev ev-checkpoint"`))
	}
}

// A box that has not synced a space since it started (restarted, or the space ran
// elsewhere) shows as its last sync the time of the space's manifest in the bucket,
// marked so; the manifest's writer is named as the fleet names the box, not by its lease
// holder id.
func TestLastSyncFromTheBucketAfterARestart(t *testing.T) {
	const host = "a.example.com"
	bkt := membucket.New()
	first := openBox(t, bkt, host)
	boxtest.Wake(t, first, host)
	if err := first.SleepNow(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	name, _ := os.Hostname()
	h := newHandler(first.Console(), nil)
	page := serve(h, httptest.NewRequest("GET", "/space/"+host, nil)).Body.String()
	if want := "<dt>Last checkpoint</dt><dd>"; !strings.Contains(page, want) || !regexp.MustCompile(`Last checkpoint</dt><dd>[^<]* ago by `+regexp.QuoteMeta(name)+`</dd>`).MatchString(page) {
		t.Fatalf("the space's page does not name this box (%s) as the checkpoint's writer:\n%s", name, page)
	}
	if strings.Contains(page, "box:test") {
		t.Fatal("the page names the box by its lease holder id")
	}

	// The same bucket, a box that never ran the space: "the box restarted".
	second := openBox(t, bkt, host)
	h = newHandler(second.Console(), nil)
	row := regexp.MustCompile(`<td class="last-sync">([^\n]*)</td>`)
	m := row.FindStringSubmatch(serve(h, httptest.NewRequest("GET", "/", nil)).Body.String())
	if m == nil || !strings.Contains(m[1], " ago") || !strings.Contains(m[1], "(bucket)") {
		t.Fatalf("last sync after a restart: %q, want the manifest's time, marked as the bucket's", m)
	}
	if page := serve(h, httptest.NewRequest("GET", "/space/"+host, nil)).Body.String(); !strings.Contains(page, "(the manifest in the bucket; this box has not synced it since it started)") {
		t.Fatalf("the space's page does not say its last sync is the bucket's:\n%s", page)
	}
	if js := serve(h, httptest.NewRequest("GET", "/api/spaces", nil)).Body.String(); !strings.Contains(js, `"last_sync":"`) {
		t.Fatalf("/api/spaces without the last sync: %s", js)
	}

	// A space never checkpointed has none.
	if _, err := second.Create(context.Background(), registry.Spec{Host: "b.example.com", Kind: "demo"}); err != nil {
		t.Fatal(err)
	}
	m = regexp.MustCompile(`data-host="b.example.com">[\s\S]*?<td class="last-sync">([^\n]*)</td>`).FindStringSubmatch(serve(h, httptest.NewRequest("GET", "/", nil)).Body.String())
	if m == nil || m[1] != "never" {
		t.Fatalf("a space never checkpointed: %q, want never", m)
	}
}

// On a box without a mesh a kind that asks for durability standby has none, and the
// space's page says why (the engine's status, through the box's console source).
func TestStandbyKindWithoutAMeshSaysWhy(t *testing.T) {
	const host = "alone.example.com"
	kinds := boxtest.InstanceKinds(t)
	k := kinds["demo"]
	k.Durability = engine.DurabilityStandby
	kinds["demo"] = k
	b := boxtest.Open(t, boxtest.Options{Bucket: membucket.New(), Settings: box.Settings{Kinds: kinds}})
	if _, err := b.Create(context.Background(), registry.Spec{Host: host, Kind: "demo"}); err != nil {
		t.Fatal(err)
	}
	boxtest.Wake(t, b, host)
	page := serve(newHandler(b.Console(), nil), httptest.NewRequest("GET", "/space/"+host, nil)).Body.String()
	if want := `<dt>Standby</dt><dd class="standby"><span class="warn">none</span>: this box is not in a mesh`; !strings.Contains(page, want) {
		t.Fatalf("the space's page lacks %q:\n%s", want, page)
	}
}

// The box page of a mesh box lists the stream its spool keeps for a space of another
// holder (the box's own spool, fed as a holder's Put feeds it).
func TestBoxPageListsTheSpoolsStreams(t *testing.T) {
	const host = "held.example.com"
	b, _ := boxtest.MeshBox(t)
	claim := spacestore.Claim{Holder: boxtest.SelfB, Incarnation: "1", Lease: `"l"`, At: time.Now().UTC()}
	for seq := int64(1); seq <= 3; seq++ {
		if err := b.Standby().Put(host, boxtest.StreamEntry(t, 4, seq, claim, 7)); err != nil {
			t.Fatal(err)
		}
	}
	w := serve(newHandler(b.Console(), nil), httptest.NewRequest("GET", "/box", nil))
	row := regexp.MustCompile(`<tr data-host="held.example.com">[\s\S]*?</tr>`).FindString(w.Body.String())
	for _, want := range []string{`box-b.example.net</a>`, `<td>4</td><td class="last-seq">3</td><td>7</td>`} {
		if w.Code != 200 || !strings.Contains(row, want) {
			t.Fatalf("the box page (%d): row %q lacks %q\n%s", w.Code, row, want, w.Body.String())
		}
	}
}
