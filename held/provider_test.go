package held

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/provider"
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
