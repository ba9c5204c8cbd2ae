package box_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

func TestMain(m *testing.M) {
	boxtest.RunInstance()
	os.Exit(m.Run())
}

// The doors through which hibernation of a space awake on box A is turned off: an
// operator on A (a live route here now) and B's row pinning the space to B.
var hibernateOff = []struct {
	door string
	off  func(ctx context.Context, b *box.Box, host string) error
}{
	{"admin", func(ctx context.Context, b *box.Box, host string) error {
		_, err := b.SetHibernate(ctx, host, false, "127.0.0.1:9")
		return err
	}},
	{"peer", func(ctx context.Context, b *box.Box, host string) error {
		_, err := b.ApplyRow(ctx, mesh.RouteRow{Host: host, Kind: "demo", LivesAt: boxtest.SelfB, Rev: boxtest.PeerRev(boxtest.SelfB)})
		return err
	}},
}

// TestHibernateOffSleepsTheSpace: turning hibernation off, through either door, puts the
// space awake here to sleep before the call returns, its writes saved; a save that fails
// is the caller's error (500), through either door, and the space's writes are kept here.
// Before, the peer's row slept the space in the background, so the call returned with
// the space still awake, and a failed save was only logged.
func TestHibernateOffSleepsTheSpace(t *testing.T) {
	for _, tc := range hibernateOff {
		t.Run(tc.door, func(t *testing.T) {
			b, bkt := boxtest.MeshBox(t)
			ctx := t.Context()
			const host = "flip.mesh.test"
			if _, err := b.Create(ctx, registry.Spec{Host: host, Kind: "demo"}); err != nil {
				t.Fatal(err)
			}
			boxtest.Wake(t, b, host)
			if err := tc.off(ctx, b, host); err != nil {
				t.Fatalf("turning hibernation off: %v", err)
			}
			if boxtest.Awake(b, host) || !boxtest.Saved(t, bkt, host) {
				t.Fatalf("after the call returned: awake %v, saved %v; want asleep and saved", boxtest.Awake(b, host), boxtest.Saved(t, bkt, host))
			}
		})
		t.Run(tc.door+" failed save", func(t *testing.T) {
			b, bkt := boxtest.MeshBox(t)
			ctx := t.Context()
			const host = "flipfail.mesh.test"
			if _, err := b.Create(ctx, registry.Spec{Host: host, Kind: "demo"}); err != nil {
				t.Fatal(err)
			}
			boxtest.Wake(t, b, host)
			boxtest.FailSaves(bkt, host)
			err := tc.off(ctx, b, host)
			if err == nil || box.StatusOf(err) != http.StatusInternalServerError || !strings.Contains(err.Error(), "sleep failed") {
				t.Fatalf("turning hibernation off with the bucket cut off: %v (status %d), want a 500 saying the sleep failed", err, box.StatusOf(err))
			}
			if rt, _ := b.Lookup(host); rt.Hibernate {
				t.Fatalf("the row was not changed: %+v", rt.Summary())
			}
		})
	}
}

// The doors through which a route on box A is removed: an operator on A and B's
// tombstone.
var remove = []struct {
	door   string
	remove func(ctx context.Context, b *box.Box, host string) error
}{
	{"admin", func(ctx context.Context, b *box.Box, host string) error { return b.Remove(ctx, host, false) }},
	{"peer", func(ctx context.Context, b *box.Box, host string) error {
		_, err := b.ApplyTombstone(ctx, host, boxtest.PeerRev(boxtest.SelfB))
		return err
	}},
}

// TestRemoveSavesTheSpace: removing a route, through either door, saves its awake space
// before the call returns; a save that fails is the caller's error (500) through either
// door, the row is gone and the space's local state kept. A peer's tombstone whose save
// failed settles when it is sent again (the sender's retry), though the row is gone by
// then. Before, a failed save on a peer's tombstone was logged and answered 200.
func TestRemoveSavesTheSpace(t *testing.T) {
	for _, tc := range remove {
		t.Run(tc.door, func(t *testing.T) {
			b, bkt := boxtest.MeshBox(t)
			ctx := t.Context()
			const host = "rm.mesh.test"
			if _, err := b.Create(ctx, registry.Spec{Host: host, Kind: "demo"}); err != nil {
				t.Fatal(err)
			}
			boxtest.Wake(t, b, host)
			if err := tc.remove(ctx, b, host); err != nil {
				t.Fatalf("removing: %v", err)
			}
			if _, ok := b.Lookup(host); ok || len(b.Spaces()) != 0 || !boxtest.Saved(t, bkt, host) {
				t.Fatalf("after the call returned: row kept %v, spaces %v, saved %v; want no row, no space, saved", ok, b.Spaces(), boxtest.Saved(t, bkt, host))
			}
		})
		t.Run(tc.door+" failed save", func(t *testing.T) {
			b, bkt := boxtest.MeshBox(t)
			ctx := t.Context()
			const host = "rmfail.mesh.test"
			if _, err := b.Create(ctx, registry.Spec{Host: host, Kind: "demo"}); err != nil {
				t.Fatal(err)
			}
			boxtest.Wake(t, b, host)
			boxtest.FailSaves(bkt, host)
			rev := boxtest.PeerRev(boxtest.SelfB)
			err := tc.remove(ctx, b, host)
			if err == nil || box.StatusOf(err) != http.StatusInternalServerError || !strings.Contains(err.Error(), "saving and stopping its space failed") {
				t.Fatalf("removing with the bucket cut off: %v (status %d), want a 500 saying the save failed", err, box.StatusOf(err))
			}
			if _, ok := b.Lookup(host); ok || len(b.Spaces()) != 1 {
				t.Fatalf("after a failed save: row kept %v, spaces %v; want the row gone and the local state kept", ok, b.Spaces())
			}
			if tc.door != "peer" {
				return
			}
			bkt.SetFail(nil)
			if _, err := b.ApplyTombstone(ctx, host, rev); err != nil {
				t.Fatalf("the tombstone sent again: %v", err)
			}
			if len(b.Spaces()) != 0 || !boxtest.Saved(t, bkt, host) {
				t.Fatalf("after the tombstone was sent again: spaces %v, saved %v; want it saved and dropped", b.Spaces(), boxtest.Saved(t, bkt, host))
			}
		})
	}
}

// TestPeerChangesRefused: a row or tombstone this box does not take is the peer's error
// with the status of its refusal, and changes nothing.
func TestPeerChangesRefused(t *testing.T) {
	b, _ := boxtest.MeshBox(t)
	ctx := t.Context()
	if _, err := b.SetHibernate(ctx, "none.mesh.test", false, "127.0.0.1:9"); box.StatusOf(err) != http.StatusNotFound {
		t.Errorf("hibernate off without a route: %v, want 404", err)
	}
	if _, err := b.Create(ctx, registry.Spec{Host: "live.mesh.test", Upstream: "127.0.0.1:9"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		apply func() error
		want  int
	}{
		{"row out of scope", func() error {
			_, err := b.ApplyRow(ctx, mesh.RouteRow{Host: "x.other.test", Kind: "demo", Hibernate: true, Rev: boxtest.PeerRev(boxtest.SelfB)})
			return err
		}, http.StatusBadRequest},
		{"row taking over a live route here", func() error {
			_, err := b.ApplyRow(ctx, mesh.RouteRow{Host: "live.mesh.test", Kind: "demo", Hibernate: true, Rev: boxtest.PeerRev(boxtest.SelfB)})
			return err
		}, http.StatusConflict},
		{"row pinned to no member", func() error {
			_, err := b.ApplyRow(ctx, mesh.RouteRow{Host: "p.mesh.test", Kind: "demo", LivesAt: "https://box-z.example.net", Rev: boxtest.PeerRev(boxtest.SelfB)})
			return err
		}, http.StatusConflict},
		{"tombstone of a live route here", func() error {
			_, err := b.ApplyTombstone(ctx, "live.mesh.test", boxtest.PeerRev(boxtest.SelfB))
			return err
		}, http.StatusConflict},
		{"tombstone with a bad revision", func() error {
			_, err := b.ApplyTombstone(ctx, "p.mesh.test", "nope")
			return err
		}, http.StatusBadRequest},
	} {
		if err := tc.apply(); box.StatusOf(err) != tc.want {
			t.Errorf("%s: %v (status %d), want %d", tc.name, err, box.StatusOf(err), tc.want)
		}
	}
	if n := b.Registry().Len(); n != 1 {
		t.Fatalf("%d routes after refused changes, want the live one only", n)
	}
	if got := b.Mesh().C.RowsRejected.Load(); got != 5 {
		t.Fatalf("rows_rejected = %d, want 5", got)
	}
}

// TestStaleAndKeptRows: a row older than what is held, or pinned to this very box,
// changes nothing and is no error.
func TestStaleAndKeptRows(t *testing.T) {
	b, _ := boxtest.MeshBox(t)
	ctx := t.Context()
	const host = "s.mesh.test"
	old := boxtest.PeerRev(boxtest.SelfB)
	if _, err := b.ApplyRow(ctx, mesh.RouteRow{Host: host, Kind: "demo", Hibernate: true, Rev: old}); err != nil {
		t.Fatal(err)
	}
	if res, err := b.ApplyRow(ctx, mesh.RouteRow{Host: host, Kind: "demo", Hibernate: true, Version: "2", Rev: old}); err != nil || !res.Stale {
		t.Fatalf("the same revision again: %+v %v, want stale", res, err)
	}
	if res, err := b.ApplyRow(ctx, mesh.RouteRow{Host: host, Kind: "demo", LivesAt: boxtest.SelfA, Rev: boxtest.PeerRev(boxtest.SelfB)}); err != nil || !res.Kept {
		t.Fatalf("a row pinned to this box: %+v %v, want kept", res, err)
	}
	if rt, _ := b.Lookup(host); rt.Version != "" || !rt.Hibernate {
		t.Fatalf("stored row changed: %+v", rt.Summary())
	}
}
