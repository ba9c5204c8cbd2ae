package console

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/standby"
)

// standbySource is fakeSource with warm standbys: a.example.com streams to box-2,
// b.example.com (a box without a mesh) has none; this box stands by for two spaces of
// box-2 and took one over; box-2's status carries no totals.
type standbySource struct {
	fakeSource
	dialled []string // the names BoxStandby was asked for
}

func (s *standbySource) SpaceStandby(host string) (box.SpaceStandby, bool) {
	switch host {
	case "a.example.com":
		return box.SpaceStandby{
			Log: engine.DurableStatus{Generation: 3, NextSeq: 12, Unproven: 4096,
				Standby: &engine.StandbyStatus{Box: "box-2", Sent: 41, Streamed: 41, Lost: 1}},
			Stream: &engine.StreamStatus{Gen: 3, Landing: 2, LandTime: 1200 * time.Microsecond},
		}, true
	case "b.example.com":
		return box.SpaceStandby{Log: engine.DurableStatus{Generation: 1, NextSeq: 5,
			Standby: &engine.StandbyStatus{NoStandby: "this box is not in a mesh: the space's answers wait for the bucket log"}}}, true
	}
	return box.SpaceStandby{}, false
}

func (s *standbySource) BoxStandby(_ context.Context, self string) (box.BoxStandby, error) {
	s.dialled = append(s.dialled, self)
	switch self {
	case "":
		return box.BoxStandby{Self: "box", StandbyFor: []box.StandbyFor{
			{HostStatus: standby.HostStatus{Host: "c.example.com", Gen: 2, Holder: "box-2", LastSeq: 17, BucketBefore: 9, Bytes: 12 << 10}, Watching: true},
			{HostStatus: standby.HostStatus{Host: "d.example.com", Gen: 1, Holder: "box-2", LastSeq: 3, Bytes: 2 << 10, Sealed: true}},
		}, Totals: &engine.StandbyTotals{Streamed: 120, Lost: 2, Takeovers: 2, TakeoverFailures: 1, Recent: []engine.Takeover{
			{Host: "d.example.com", Holder: "box-2", Why: "its address refuses connections", At: time.Now(), Took: 712 * time.Millisecond},
			{Host: "e.example.com", Holder: "box-2", Why: "restarted", At: time.Now(), Took: 3 * time.Second, Err: "reading the log: boom"},
		}}}, nil
	case "box-2":
		return box.BoxStandby{Self: "box-2", StandbyFor: []box.StandbyFor{
			{HostStatus: standby.HostStatus{Host: "a.example.com", Gen: 3, Holder: "box", LastSeq: 41, Bytes: 80 << 10}, Watching: true},
		}}, nil
	}
	return box.BoxStandby{}, errors.New("no live box")
}

// A space of standby durability shows its standby box (a link to its page), how far it
// is (the stream's segment it has, those on the way, the segments streamed and standbys
// lost since the wake) and the bucket log behind it; one with no standby says why.
func TestSpacePageShowsItsStandby(t *testing.T) {
	h := newHandler(&standbySource{}, nil)
	page := serve(h, httptest.NewRequest("GET", "/space/a.example.com", nil)).Body.String()
	for _, want := range []string{
		`<dt>Standby</dt><dd class="standby"><a href="../box?self=box-2">box-2</a>: has segment 41 of the stream; 41 segments streamed since the wake, <span class="bad">1 standby lost</span>; 2 segments on the way to it, recent ones on its disk in 1 ms.`,
		`Behind it, the bucket log: generation 3, next segment 12, 4.0 KiB not landed yet.</small></dd>`,
	} {
		if !strings.Contains(page, want) {
			t.Fatalf("the space's page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "Without a standby") {
		t.Fatal("a space with a standby is said to have none")
	}
	page = serve(h, httptest.NewRequest("GET", "/space/b.example.com", nil)).Body.String()
	if want := `<span class="warn">none</span>: this box is not in a mesh: the space&#39;s answers wait for the bucket log; 0 segments streamed`; !strings.Contains(page, want) {
		t.Fatalf("the page of a space with no standby lacks %q:\n%s", want, page)
	}
	// A source without standbys: no line for a bucket kind.
	if page := serve(newHandler(&fakeSource{}, nil), httptest.NewRequest("GET", "/space/a.example.com", nil)).Body.String(); strings.Contains(page, "<dt>Standby</dt>") {
		t.Fatal("a bucket kind's page shows a standby")
	}
}

// The box page lists the spaces the box stands by for (holder, last segment, bytes,
// watching or sealed) and its takeovers with their durations; the fleet links each box's
// page; a peer's is read from its status; a name the fleet does not list is 404 and never
// asked for.
func TestBoxPageShowsWhatItStandsByFor(t *testing.T) {
	src := &standbySource{}
	h := newHandler(src, nil)
	if idx := serve(h, httptest.NewRequest("GET", "/", nil)).Body.String(); !strings.Contains(idx, `<th scope="row">box-2 <small><a class="box-page" href="./box?self=box-2">box page</a></small></th>`) {
		t.Fatalf("the fleet table does not link the box page:\n%s", idx)
	}
	w := serve(h, httptest.NewRequest("GET", "/box", nil))
	page := w.Body.String()
	for _, want := range []string{
		`<h1>box <span class="tag">this box</span></h1>`,
		`2 spaces whose stream this box keeps on its disk`,
		`<td class="holder"><a href="./box?self=box-2">box-2</a></td>
      <td>2</td><td class="last-seq">17</td><td>9</td><td class="bytes">12.0 KiB</td>
      <td class="stream-state"><span class="ok">watching</span> its holder</td>`,
		`<td class="stream-state"><span class="warn">sealed</span> (taken over)</td>`,
		`<dd class="streamed">120 segments streamed to standbys, <span class="bad">2 standbys lost</span></dd>`,
		`<dd class="takeovers">2 spaces taken over from a dead holder, <span class="bad">1 failed</span></dd>`,
		`<td>its address refuses connections</td>
      <td class="took"><strong>712 ms</strong></td><td>ok</td>`,
		`<td class="took"><strong>3000 ms</strong></td><td><span class="bad">reading the log: boom</span></td>`,
	} {
		if w.Code != 200 || !strings.Contains(page, want) {
			t.Fatalf("the box page (%d) lacks %q:\n%s", w.Code, want, page)
		}
	}
	w = serve(h, httptest.NewRequest("GET", "/box?self=box-2", nil))
	if page := w.Body.String(); w.Code != 200 || !strings.Contains(page, `<a href="./space/a.example.com">a.example.com</a>`) || strings.Contains(page, "Takeovers") {
		t.Fatalf("a peer's box page (%d): want its stream, no totals it did not publish:\n%s", w.Code, page)
	}
	if js := serve(h, httptest.NewRequest("GET", "/api/box?self=box-2", nil)).Body.String(); !strings.Contains(js, `"standby_for":[{"host":"a.example.com"`) || !strings.Contains(js, `"watching":true`) {
		t.Fatalf("/api/box: %s", js)
	}
	src.dialled = nil
	for _, path := range []string{"/box?self=http://169.254.169.254", "/api/box?self=box-3"} {
		if w := serve(h, httptest.NewRequest("GET", path, nil)); w.Code != 404 {
			t.Fatalf("%s: %d, want 404", path, w.Code)
		}
	}
	if len(src.dialled) != 0 {
		t.Fatalf("the console asked for boxes the fleet does not list: %q", src.dialled)
	}
}
