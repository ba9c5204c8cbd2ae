package held

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/internal/testwait"
	"github.com/lchat/lchat-caddy/provider"
	"github.com/lchat/lchat-caddy/registry"
)

// An instance at a provider is named under the provider's name on the fleet's side:
// never a box of the fleet (whose heartbeats would call it gone), and given back to the
// provider as the provider named it.
func TestProviderAtNamesTheProvider(t *testing.T) {
	at := connhold.At{Box: "https://10.0.0.3:8443", Incarnation: "inc", Instance: "7"}
	pa := providerAt("partner", at)
	if !strings.HasPrefix(pa.Box, providerAtPrefix) || pa == at {
		t.Fatalf("providerAt: %v", pa)
	}
	back, err := connhold.ParseAt(pa.String())
	if err != nil || back != pa {
		t.Fatalf("a provider's instance does not round-trip as an At: %v %v", back, err)
	}
	name, inner, ok := fromProviderAt(pa)
	if !ok || name != "partner" || inner != at {
		t.Fatalf("fromProviderAt(%v) = %q %v %v", pa, name, inner, ok)
	}
	if _, _, ok := fromProviderAt(at); ok {
		t.Fatalf("a box of the fleet taken for a provider's: %v", at)
	}
}

// What the instance of a hosted space sends waits only for the fleets' entry boxes that
// upgraded or sent an event there (an outbox each), never for a peer of the mesh; a
// notice goes to its entry box alone; an outbox past its bound loses its oldest items;
// one nobody pulls from is dropped.
func TestOutboxesKeepWhatTheEntryBoxesPull(t *testing.T) {
	c := &Conns{log: zap.NewNop()}
	const host = "room.example.com"
	e1, e2 := provider.ClientEntry("fleet-a", "https://a1"), provider.ClientEntry("fleet-a", "https://a2")
	send := pullItem{Control: &controlCall{Path: connhold.SendPath, Query: "tag=room", Body: []byte("hi")}}
	if c.enqueue(host, "", send) {
		t.Fatal("queued with no entry box")
	}
	c.touch(host, "https://peer-of-the-mesh")
	if c.enqueue(host, "", send) {
		t.Fatal("queued for a peer of the mesh")
	}
	c.touch(host, e1)
	c.touch(host, e2)
	if !c.enqueue(host, "", send) {
		t.Fatal("a send not queued for the entry boxes")
	}
	c.enqueue(host, e2, pullItem{Notice: &connhold.Notice{Space: host, At: "a b c", Covered: 3}})
	items := func(e string) []pullItem {
		c.out.mu.Lock()
		defer c.out.mu.Unlock()
		var out []pullItem
		for _, l := range c.out.by[host][e].items {
			var it pullItem
			if err := json.Unmarshal(l, &it); err != nil {
				t.Fatal(err)
			}
			out = append(out, it)
		}
		return out
	}
	if got := items(e1); len(got) != 1 || got[0].Control == nil || string(got[0].Control.Body) != "hi" {
		t.Fatalf("e1's outbox: %+v", got)
	}
	if got := items(e2); len(got) != 2 || got[1].Notice == nil || got[1].Notice.Covered != 3 {
		t.Fatalf("e2's outbox: %+v", got)
	}

	big := pullItem{Control: &controlCall{Path: connhold.SendPath, Body: make([]byte, maxPullBytes/3)}}
	for range 5 {
		c.enqueue(host, e1, big)
	}
	c.out.mu.Lock()
	ob := c.out.by[host][e1]
	if ob.bytes > maxPullBytes || len(ob.items) == 0 {
		t.Errorf("an outbox past its bound: %d bytes in %d items", ob.bytes, len(ob.items))
	}
	for _, ob := range c.out.by[host] {
		ob.touched = time.Now().Add(-outboxIdle - time.Second)
	}
	c.out.mu.Unlock()
	if c.enqueue(host, "", send) {
		t.Error("queued for entry boxes that stopped pulling long ago")
	}
}

// roundTripFunc is an http.RoundTripper from a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A provider's answer to an event is untrusted: its instance is named under the
// provider's name, it may ask for a replay only of the priors it was sent (in its own
// naming), and an answer too large, unstamped or malformed acknowledges nothing; a
// provider that cannot be reached has not seen the event.
func TestProviderEventAnswersAreUntrusted(t *testing.T) {
	c := openConns(t, boxtest.Open(t, boxtest.Options{}))
	const host = "room.example.com"
	mine := connhold.At{Box: "https://p1:443", Incarnation: "i1", Instance: "3"}
	fleetBox := connhold.At{Box: "https://a2:443", Incarnation: "j", Instance: "1"}
	ev := connhold.Event{Space: host, ConnID: connhold.NewID(), Seq: 4, Kind: connhold.KindText, Payload: []byte("hi"),
		Prior: []connhold.At{providerAt("partner", mine), fleetBox}}
	answer := func(code int, h map[string][]string, body string) func(*http.Request) (*http.Response, error) {
		return func(r *http.Request) (*http.Response, error) {
			rec := httptest.NewRecorder()
			for k, v := range h {
				rec.Header()[k] = v
			}
			rec.WriteHeader(code)
			rec.WriteString(body)
			return rec.Result(), nil
		}
	}
	stamp := map[string][]string{connhold.AckAtHeader: {"https://p2:443 i2 9"}, connhold.AckMarkHeader: {"5"}}
	for _, tc := range []struct {
		name    string
		rt      func(*http.Request) (*http.Response, error)
		replay  []connhold.At
		err     error
		replyAt connhold.At
	}{
		{name: "acknowledged", rt: answer(200, stamp, "ok"), replyAt: providerAt("partner", connhold.At{Box: "https://p2:443", Incarnation: "i2", Instance: "9"})},
		{name: "a replay of what it was sent", rt: answer(409, map[string][]string{connhold.ReplayHeader: {mine.String(), fleetBox.String()}}, ""),
			replay: []connhold.At{providerAt("partner", mine), fleetBox}},
		{name: "a replay of an instance it was not sent", rt: answer(409, map[string][]string{connhold.ReplayHeader: {"https://a9:443 x 1"}}, ""),
			err: connhold.ErrNotAcknowledged},
		{name: "no mark", rt: answer(200, map[string][]string{connhold.AckAtHeader: {"https://p2:443 i2 9"}}, "ok"), err: errors.New("no mark")},
		{name: "too large", rt: answer(200, stamp, strings.Repeat("x", connhold.MaxAnswer+1)), err: connhold.ErrNotAcknowledged},
		{name: "refused", rt: answer(503, map[string][]string{connhold.RefusedHeader: {"1"}}, ""), err: connhold.ErrNotDelivered},
		{name: "unreachable", rt: func(*http.Request) (*http.Response, error) {
			return nil, provider.DialError{Err: errors.New("connection refused")}
		}, err: connhold.ErrNotDelivered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sent http.Header
			c.SetProviders(func(name string) http.RoundTripper {
				if name != "partner" {
					return nil
				}
				return roundTripFunc(func(r *http.Request) (*http.Response, error) { sent = r.Header.Clone(); return tc.rt(r) })
			})
			d := &eventDoor{c: c, ctx: context.Background(), ev: ev}
			d.Provider("partner")
			if got := sent.Values(connhold.PriorHeader); len(got) != 2 || got[0] != mine.String() || got[1] != fleetBox.String() {
				t.Fatalf("priors sent %q: want the provider's own naming of its instance", got)
			}
			re, isReplay := connhold.IsReplay(d.err)
			switch {
			case tc.replay != nil:
				if !isReplay || !slices.Equal(re.Stale, tc.replay) {
					t.Fatalf("replay %v (%v), want %v", re, d.err, tc.replay)
				}
			case tc.err != nil:
				if d.err == nil || isReplay || (errors.Is(tc.err, connhold.ErrNotDelivered) || errors.Is(tc.err, connhold.ErrNotAcknowledged)) && !errors.Is(d.err, tc.err) {
					t.Fatalf("error %v, want %v", d.err, tc.err)
				}
			default:
				if d.err != nil || d.reply.At != tc.replyAt || d.reply.Mark != 5 {
					t.Fatalf("reply %+v %v, want at %v mark 5", d.reply, d.err, tc.replyAt)
				}
			}
		})
	}
}

// delegatedConn holds, on a box of its own, a WebSocket of host delegated to the provider
// "partner" (c, the client's side ws, its connection id), tagged "room", one message of
// which ("hi") an instance at the provider (providerInstance, in the provider's naming)
// acknowledged. The provider's pull goes to pull, its entry box named as the provider's
// box names a fleet's (provider.ClientEntry, fleet "fleet-a"); nil: it waits and brings
// nothing.
func delegatedConn(t *testing.T, host string, pull http.Handler) (b *box.Box, c *Conns, ws *websocket.Conn, id string) {
	t.Helper()
	b = boxtest.Open(t, boxtest.Options{})
	c = openConns(t, b)
	if _, err := b.Registry().Put(registry.Route{Host: host, Kind: "demo", Hibernate: true, Provider: "partner"}); err != nil {
		t.Fatal(err)
	}
	c.SetProviders(func(name string) http.RoundTripper {
		if name != "partner" {
			return nil
		}
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.URL.Path == provider.PullPath {
				if pull == nil {
					<-r.Context().Done()
					return nil, r.Context().Err()
				}
				r.Header.Set(connhold.EntryHeader, provider.ClientEntry("fleet-a", r.Header.Get(connhold.EntryHeader)))
				rec := httptest.NewRecorder()
				pull.ServeHTTP(rec, r)
				return rec.Result(), nil
			}
			rec := httptest.NewRecorder()
			rec.Header().Set(connhold.AckAtHeader, providerInstance)
			rec.Header().Set(connhold.AckMarkHeader, "5")
			rec.WriteHeader(http.StatusOK)
			return rec.Result(), nil
		})
	})
	id = connhold.NewID()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := c.Accept(w, r, host, id, http.Header{connhold.SetTagsHeader: {"room"}}, nil); err != nil {
			t.Errorf("Accept: %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	ws, _, err := websocket.Dial(t.Context(), srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	if err := ws.Write(t.Context(), websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	testwait.WaitFor(t, 10*time.Second, "the message acknowledged at the provider", func() bool { return c.hub.Stats().Delivered == 1 })
	return b, c, ws, id
}

// providerInstance is the instance at the provider that acknowledges delegatedConn's
// messages, as the provider names it.
const providerInstance = "https://p2:443 i2 9"

// TestLeavingAProviderRedeliversWhatItAcknowledged: a message of a held WebSocket that an
// instance at the provider acknowledged, and no pulled notice covered, is delivered again
// once the space's route no longer names that provider (reclaimed), not only at the
// connection's next message; while the route names it, nothing is.
func TestLeavingAProviderRedeliversWhatItAcknowledged(t *testing.T) {
	const host = "room.example.com"
	b, c, _, _ := delegatedConn(t, host, nil)
	if n := c.leftProviders(time.Now()); n != 0 || c.hub.Stats().Replayed != 0 {
		t.Fatalf("still delegated: %d instances taken for gone, %d messages replayed", n, c.hub.Stats().Replayed)
	}
	if _, err := b.Registry().Put(registry.Route{Host: host, Kind: "demo", Hibernate: true}); err != nil {
		t.Fatal(err)
	}
	c.leftProviders(time.Now()) // or the watch's tick did
	if got := c.hub.Stats().Replayed; got != 1 {
		t.Fatalf("after the reclaim: %d messages replayed, want 1", got)
	}
}

// TestApplyPulledStaysInItsSpace: what a provider's pull of one space brings acts on that
// space's connections alone: a notice about another space is ignored (the same notice
// about this one replays what the instance acknowledged), and a control call is applied
// only when its path is one of the control paths exactly (a path that carries its own
// query, here a close of the connection, is ignored; a send that follows reaches the
// client first).
func TestApplyPulledStaysInItsSpace(t *testing.T) {
	const host = "room.example.com"
	_, c, ws, id := delegatedConn(t, host, nil)
	gone := func(space string) pullItem {
		return pullItem{Notice: &connhold.Notice{Space: space, At: providerInstance, Covered: 0, Gone: true}}
	}
	c.applyPulled(host, "partner", gone("other.example.com"))
	if got := c.hub.Stats().Replayed; got != 0 {
		t.Fatalf("a notice about another space replayed %d messages of this one", got)
	}
	c.applyPulled(host, "partner", pullItem{Control: &controlCall{Path: connhold.ClosePath + "?conn=" + id + "&code=4000&reason=x"}})
	c.applyPulled(host, "partner", pullItem{Control: &controlCall{Path: connhold.SendPath, Query: "conn=" + id, Body: []byte("after")}})
	typ, msg, err := ws.Read(t.Context())
	if err != nil || typ != websocket.MessageText || string(msg) != "after" {
		t.Fatalf("the client read %v %q %v, want the send (a call to another path applied?)", typ, msg, err)
	}
	c.applyPulled(host, "partner", gone(host))
	if got := c.hub.Stats().Replayed; got != 1 {
		t.Fatalf("the notice about this space replayed %d messages, want 1", got)
	}
}
