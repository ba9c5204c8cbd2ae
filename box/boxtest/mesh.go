package boxtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

// The two boxes of MeshBox's mesh, on the mesh domain Domain.
const (
	SelfA  = "https://box-a.example.net"
	SelfB  = "https://box-b.example.net"
	Domain = "mesh.test"
	Token  = "boxtest-mesh-token"
)

// Join puts a heartbeat of self (covering Domain) in bkt for the test's length: a peer the
// boxes on bkt count live.
func Join(t testing.TB, bkt bucket.Bucket, self string) *mesh.Membership {
	t.Helper()
	m, err := mesh.NewMembership(bkt, mesh.MembershipConfig{Self: self, Domains: []string{Domain}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// MeshBox opens box A (SelfA) of a mesh whose other box, B (SelfB), is a heartbeat only,
// running spaces of this test binary (InstanceKinds); its bucket fails on demand
// (FailSaves).
func MeshBox(t testing.TB) (*box.Box, *membucket.Counting) {
	t.Helper()
	bkt := membucket.NewCounting(membucket.New())
	Join(t, bkt, SelfB)
	b := Open(t, Options{Bucket: bkt,
		Mesh:     mesh.Config{Self: SelfA, Domains: []string{Domain}, Token: Token},
		Settings: box.Settings{Kinds: InstanceKinds(t)}})
	return b, bkt
}

// MeshSpace is MeshBox with host's space created and awake on A, a note written (Wake).
func MeshSpace(t testing.TB, host string) (*box.Box, *membucket.Counting) {
	t.Helper()
	b, bkt := MeshBox(t)
	if _, err := b.Create(context.Background(), registry.Spec{Host: host, Kind: "demo"}); err != nil {
		t.Fatal(err)
	}
	Wake(t, b, host)
	return b, bkt
}

// PeerRev is a revision of origin's, newer than any a box made before now.
func PeerRev(origin string) string {
	return fmt.Sprintf("%016x-%s", uint64(time.Now().Add(time.Second).UnixMilli())<<16, origin)
}

// FailSaves makes every write under host's space in bkt fail, as a bucket cut off would;
// bkt.SetFail(nil) heals it.
func FailSaves(bkt *membucket.Counting, host string) {
	bkt.SetFail(func(_ context.Context, op membucket.Op, key string) error {
		if op == membucket.OpPut && strings.HasPrefix(key, "spaces/"+host+"/") {
			return errors.New("bucket cut off (test)")
		}
		return nil
	})
}

// Saved reports whether host's checkpoint in bkt holds the note Wake wrote.
func Saved(t testing.TB, bkt bucket.Bucket, host string) bool {
	t.Helper()
	m, _, err := spacestore.ReadManifest(context.Background(), bkt, host)
	if err != nil {
		t.Fatal(err)
	}
	if m == nil {
		return false
	}
	for _, f := range m.Files {
		if f.Path == "notes.txt" {
			return true
		}
	}
	return false
}
