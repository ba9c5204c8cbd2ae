package mesh

import (
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/registry"
)

func TestTargets(t *testing.T) {
	ms := []Member{
		{Self: "https://me.example.net", Domains: []string{"example.com"}, Region: "ie"},
		{Self: "https://b.example.net", Domains: []string{"example.com"}, Region: "ie"},
		{Self: "https://c.example.net", Domains: []string{"other.org"}, Region: "fi"},
		{Self: "https://d.example.net", Domains: []string{"other.org"}, Region: "ie"},
	}
	for _, tc := range []struct {
		host, region string
		want         []string
	}{
		{"a.example.com", "", []string{"https://b.example.net"}},
		{"a.example.com", "fi", []string{"https://b.example.net", "https://c.example.net"}},
		{"a.other.org", "", []string{"https://c.example.net", "https://d.example.net"}},
		{"a.nowhere.net", "ie", []string{"https://b.example.net", "https://d.example.net"}},
		{"a.nowhere.net", "", nil},
	} {
		if got := selves(Targets(tc.host, tc.region, ms, "https://me.example.net")); !sameStrings(got, tc.want) {
			t.Errorf("Targets(%s, %q) = %v, want %v", tc.host, tc.region, got, tc.want)
		}
	}
	// A draining member gets no rows: it is shutting down.
	ms[1].Draining = true
	if got := selves(Targets("a.example.com", "fi", ms, "https://me.example.net")); !sameStrings(got, []string{"https://c.example.net"}) {
		t.Errorf("Targets with b draining = %v, want only c", got)
	}
}

// The Replicator sends a changed row to the live peers that cover its host (never to
// this box or a draining one) and a tombstone likewise, in the background, and counts
// the targets tried and failed.
func TestReplicator(t *testing.T) {
	p1, u1 := startPeer(t)
	p2, u2 := startPeer(t)
	p2.fail.Store(100) // every attempt fails
	_, u3 := startPeer(t)
	members := []Member{{Self: "https://self.example.com", Domains: []string{"example.com"}},
		{Self: u1, Domains: []string{"example.com"}}, {Self: u2, Domains: []string{"example.com"}},
		{Self: u3, Domains: []string{"example.com"}, Draining: true}}
	box := &Node{Self: "https://self.example.com", Domains: []string{"example.com"}, Live: func() []Member { return members }}
	r := &Replicator{Node: box, Client: &Client{Token: testToken, RetryDelay: time.Millisecond}, Ctx: t.Context()}
	r.Put(registry.Route{Host: "a.example.com", Kind: "chat", Hibernate: true})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, _ := r.Counts(); n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("fan-out results never counted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n, failed := r.Counts(); n != 2 || failed != 1 {
		t.Errorf("counts %d tried, %d failed; want 2 and 1 (the draining peer is left out)", n, failed)
	}
	p1.mu.Lock()
	_, ok := p1.rows["a.example.com"]
	p1.mu.Unlock()
	if !ok {
		t.Error("the row did not reach the live peer")
	}
}
