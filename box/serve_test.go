package box_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

// TestRefusalOf: a space that cannot be served now is a 503 with the engine's hint and a
// reason, never a 502; a client gone while it waited is 499; only an unexpected failure
// is worth a log line.
func TestRefusalOf(t *testing.T) {
	const host = "r.example.com"
	for _, tc := range []struct {
		name       string
		err        error
		gone       bool
		status     int
		after      time.Duration
		says       string
		unexpected bool
	}{
		{"lease held", &engine.LeaseHeldError{Holder: "box:x"}, false, 503, 0, "held by another box", false},
		{"backoff", &engine.RetryError{After: 7 * time.Second, Reason: "failed wake"}, false, 503, 7 * time.Second, "failed wake", false},
		{"draining", fmt.Errorf("acquiring: %w", engine.ErrDraining), false, 503, engine.ErrDraining.After, "shutting down", false},
		{"kind gone", engine.ErrUnknownKind, false, 503, 0, "kind is not configured", false},
		{"client gone", context.Canceled, true, 499, 0, "canceled", false},
		{"canceled, client here", context.Canceled, false, 503, 0, "waking space", true},
		{"bucket down", errors.New("bucket unreachable"), false, 503, 0, "waking space " + host + " failed", true},
	} {
		ref := box.RefusalOf(host, tc.err, tc.gone)
		if ref.Status != tc.status || ref.RetryAfter != tc.after || !strings.Contains(ref.Err.Error(), tc.says) || ref.Unexpected != tc.unexpected {
			t.Errorf("%s: %+v, want status %d, retry after %v, saying %q, unexpected %v", tc.name, ref, tc.status, tc.after, tc.says, tc.unexpected)
		}
		if ref.Status != http.StatusServiceUnavailable && ref.Status != 499 {
			t.Errorf("%s: status %d", tc.name, ref.Status)
		}
	}
}

// TestEngineCounters: every engine counter is flattened, by its JSON name.
func TestEngineCounters(t *testing.T) {
	got := box.EngineCounters(engine.Counters{Wakes: 1, LeaseConflicts: 2, OOMKills: 3, SkippedFiles: 4, CapRefusals: 5})
	for name, want := range map[string]uint64{"wakes": 1, "lease_conflicts": 2, "oom_kills": 3, "skipped_files": 4, "cap_refusals": 5, "sleeps": 0} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %d (present %v), want %d", name, v, ok, want)
		}
	}
	if len(got) != 12 {
		t.Errorf("%d counters, want the engine's 12: %v", len(got), got)
	}
}

// fakeProxy records what Serve asked of it; forward is Forward's result.
type fakeProxy struct {
	forward  box.Forwarded
	forwards []string
	live     string
	instance bool
	refused  *box.Refusal
}

func (p *fakeProxy) Forward(d mesh.Decision) (box.Forwarded, error) {
	p.forwards = append(p.forwards, d.Peer)
	if p.forward == box.NotSent {
		return box.NotSent, errors.New("connection refused")
	}
	return box.Answered, nil
}
func (p *fakeProxy) Live(upstream string) error     { p.live = upstream; return nil }
func (p *fakeProxy) Instance(use *engine.Use) error { p.instance = true; return nil }
func (p *fakeProxy) Refuse(ref box.Refusal) error {
	p.refused = &ref
	return ref.Err
}

// TestServe: what becomes of a request, decided in one pass: an unknown host is 404, a
// live route goes to its upstream, a pinned one that cannot be forwarded is a 503, a
// space of a kind this box lacks is a 503, a space is woken and served here.
func TestServe(t *testing.T) {
	b := boxtest.Open(t, boxtest.Options{Settings: box.Settings{Kinds: boxtest.InstanceKinds(t)}})
	reg := b.Registry()
	for _, rt := range []registry.Route{
		{Host: "live.example.com", Upstream: "127.0.0.1:9"},
		{Host: "pinned.example.com", LivesAt: "https://box-b.example.net"},
		{Host: "nokind.example.com", Kind: "gone", Hibernate: true},
		{Host: "space.example.com", Kind: "demo", Hibernate: true},
	} {
		if _, err := reg.Put(rt); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		host   string
		status int // of the refusal; 0: served
		says   string
		live   string
	}{
		{"unknown.example.com", 404, "no route", ""},
		{"live.example.com", 0, "", "127.0.0.1:9"},
		{"pinned.example.com", 503, "runs on another box", ""},
		{"nokind.example.com", 503, "kind is not configured", ""},
		{"space.example.com", 0, "", ""},
	} {
		p := &fakeProxy{}
		b.Serve(t.Context(), box.Request{Host: tc.host}, p)
		switch {
		case tc.status != 0 && (p.refused == nil || p.refused.Status != tc.status || !strings.Contains(p.refused.Err.Error(), tc.says)):
			t.Errorf("%s: refused %+v, want %d saying %q", tc.host, p.refused, tc.status, tc.says)
		case tc.status == 0 && p.refused != nil:
			t.Errorf("%s: refused %+v, want it served", tc.host, p.refused)
		case tc.live != p.live || tc.status == 0 && tc.live == "" && !p.instance:
			t.Errorf("%s: live %q instance %v", tc.host, p.live, p.instance)
		}
	}
}

// TestServeFallsBackHere: a request placed on a peer that cannot be reached at all is
// served here (the lease decides who runs the space); one the peer took is its answer.
func TestServeFallsBackHere(t *testing.T) {
	b, _ := boxtest.MeshBox(t)
	host := ""
	for i := 0; host == ""; i++ {
		if h := fmt.Sprintf("s%d.%s", i, boxtest.Domain); !b.Mesh().Node().Owns(h, "") {
			host = h
		}
	}
	if _, err := b.Create(t.Context(), registry.Spec{Host: host, Kind: "demo"}); err != nil {
		t.Fatal(err)
	}
	p := &fakeProxy{forward: box.Answered}
	if err := b.Serve(t.Context(), box.Request{Host: host}, p); err != nil || len(p.forwards) != 1 || p.forwards[0] != boxtest.SelfB || p.instance {
		t.Fatalf("a reachable owner: %v, forwards %v, served here %v; want it forwarded to B", err, p.forwards, p.instance)
	}
	// Known awake at B (a holder entry): a forward that reaches nothing forgets it.
	b.Mesh().Node().Holders.Put(host, boxtest.SelfB)
	p = &fakeProxy{forward: box.NotSent}
	if err := b.Serve(t.Context(), box.Request{Host: host}, p); err != nil || len(p.forwards) != 1 || !p.instance || p.refused != nil {
		t.Fatalf("an unreachable owner: %v, forwards %v, served here %v, refused %+v; want it served here", err, p.forwards, p.instance, p.refused)
	}
	if at, ok := b.Mesh().Node().Holders.Get(host); ok {
		t.Fatalf("the holder entry for an unreachable peer was kept: %v", at)
	}
	if n := b.Mesh().C.ForwardFallback.Load(); n != 1 {
		t.Fatalf("forward_fallback = %d, want 1", n)
	}
}

// TestServeReopenNeverWakes: a held event stream's reopen (Request.Reopen) is served here
// only while its space is awake here; asleep, it goes to the peer that announced the
// space awake, or where placement forwards it, and is otherwise refused with 409, never
// a wake; a peer's reopen (Hops > 0) of a space asleep here is 409 too.
func TestServeReopenNeverWakes(t *testing.T) {
	b := boxtest.Open(t, boxtest.Options{Settings: box.Settings{Kinds: boxtest.InstanceKinds(t)}})
	const host = "space.example.com"
	if _, err := b.Registry().Put(registry.Route{Host: host, Kind: "demo", Hibernate: true}); err != nil {
		t.Fatal(err)
	}
	for _, req := range []box.Request{{Host: host, Reopen: true}, {Host: host, Reopen: true, Hops: 1}} {
		p := &fakeProxy{}
		b.Serve(t.Context(), req, p)
		if p.refused == nil || p.refused.Status != http.StatusConflict || p.instance || boxtest.Awake(b, host) {
			t.Fatalf("%+v of a sleeping space: refused %+v, instance %v, awake %v; want 409 and no wake", req, p.refused, p.instance, boxtest.Awake(b, host))
		}
	}
	boxtest.Wake(t, b, host)
	p := &fakeProxy{}
	if b.Serve(t.Context(), box.Request{Host: host, Reopen: true}, p); !p.instance || p.refused != nil {
		t.Fatalf("reopen of an awake space: instance %v, refused %+v; want it served here", p.instance, p.refused)
	}

	mb, _ := boxtest.MeshBox(t)
	mhost := ""
	for i := 0; mhost == ""; i++ {
		if h := fmt.Sprintf("s%d.%s", i, boxtest.Domain); mb.Mesh().Node().Owns(h, "") {
			mhost = h
		}
	}
	if _, err := mb.Create(t.Context(), registry.Spec{Host: mhost, Kind: "demo"}); err != nil {
		t.Fatal(err)
	}
	p = &fakeProxy{forward: box.Answered}
	mb.Serve(t.Context(), box.Request{Host: mhost, Reopen: true, AwakeAt: boxtest.SelfB}, p)
	if len(p.forwards) != 1 || p.forwards[0] != boxtest.SelfB || p.instance || boxtest.Awake(mb, mhost) {
		t.Fatalf("reopen announced awake at B: forwards %v, instance %v; want it forwarded to B, no wake here", p.forwards, p.instance)
	}
	p = &fakeProxy{forward: box.NotSent}
	mb.Serve(t.Context(), box.Request{Host: mhost, Reopen: true, AwakeAt: boxtest.SelfB}, p)
	if p.instance || p.refused == nil || boxtest.Awake(mb, mhost) {
		t.Fatalf("reopen whose peer cannot be reached: instance %v, refused %+v; want a refusal, no wake here", p.instance, p.refused)
	}
	p = &fakeProxy{}
	mb.Serve(t.Context(), box.Request{Host: mhost, Reopen: true}, p)
	if p.refused == nil || p.refused.Status != http.StatusConflict || p.instance || len(p.forwards) != 0 {
		t.Fatalf("reopen of a space owned here and asleep: refused %+v, instance %v, forwards %v; want 409", p.refused, p.instance, p.forwards)
	}
}
