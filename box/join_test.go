package box_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/mesh"
)

// TestJoinSeedsBeforeTheFirstHeartbeat: a box that joins a mesh holds its peers' rows of
// its scope as soon as it is open, before any peer has seen its heartbeat (a load
// balancer sends it clients, and peers forward to it, from then on): here the peer
// answers its routes listing and never pushes a row, as a peer that has not listed the
// new heartbeat yet does not. A row outside the box's scope is not taken, and a row older
// than the tombstone TTL is (a catch-up would never send it).
func TestJoinSeedsBeforeTheFirstHeartbeat(t *testing.T) {
	old := "0000000000010000-" + boxtest.SelfB // long before the tombstone TTL
	rows := []mesh.RouteRow{
		{Host: "joined." + boxtest.Domain, Kind: "demo", Hibernate: true, Rev: boxtest.PeerRev(boxtest.SelfB)},
		{Host: "old." + boxtest.Domain, Kind: "demo", Hibernate: true, Rev: old},
		{Host: "elsewhere.example.org", Kind: "demo", Hibernate: true, Rev: boxtest.PeerRev(boxtest.SelfB)},
	}
	var listed atomic.Int32
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != mesh.PathRoutes || r.Header.Get("Authorization") != "Bearer "+boxtest.Token {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		listed.Add(1)
		mesh.WriteRoutes(w, rows)
	}))
	defer peer.Close()
	bkt := membucket.New()
	boxtest.Join(t, bkt, peer.URL)
	b := boxtest.Open(t, boxtest.Options{Bucket: bkt,
		Mesh: mesh.Config{Self: boxtest.SelfA, Domains: []string{boxtest.Domain}, Token: boxtest.Token}})
	if listed.Load() == 0 {
		t.Fatal("the joining box never listed its peer's routes")
	}
	for _, h := range []string{"joined." + boxtest.Domain, "old." + boxtest.Domain} {
		rt, ok := b.Registry().Lookup(h)
		if !ok {
			t.Fatalf("%s is not on the box once it is open", h)
		}
		if want := rowRev(rows, h); rt.Rev != want {
			t.Errorf("%s stored at revision %s, want the peer's %s", h, rt.Rev, want)
		}
	}
	if _, ok := b.Registry().Lookup("elsewhere.example.org"); ok {
		t.Error("a row outside the box's mesh domains was seeded")
	}
	// The first box of a mesh (no peer) opens as before.
	alone := boxtest.Open(t, boxtest.Options{Bucket: membucket.New(),
		Mesh: mesh.Config{Self: boxtest.SelfA, Domains: []string{boxtest.Domain}, Token: boxtest.Token}})
	if n := alone.Registry().Len(); n != 0 {
		t.Fatalf("a box alone holds %d rows", n)
	}
}

func rowRev(rows []mesh.RouteRow, host string) string {
	for _, r := range rows {
		if r.Host == host {
			return r.Rev
		}
	}
	return ""
}
