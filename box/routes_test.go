package box_test

import (
	"context"
	"fmt"
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

// changes are the route changes that take a space off box A, each through both doors:
// turning hibernation off (an operator on A makes it a live route here; B's row pins it
// to B) and removing the route (an operator on A; B's tombstone).
var changes = []struct {
	change, door string
	do           func(ctx context.Context, b *box.Box, host string) error
	// fails is what the error of a failed save says.
	fails string
	// gone: the change deletes the row, and the space's local state with it once saved.
	gone bool
}{
	{"hibernate off", "admin", func(ctx context.Context, b *box.Box, host string) error {
		_, err := b.SetHibernate(ctx, host, false, "127.0.0.1:9")
		return err
	}, "sleep failed", false},
	{"hibernate off", "peer", func(ctx context.Context, b *box.Box, host string) error {
		_, err := b.ApplyRow(ctx, mesh.RouteRow{Host: host, Kind: "demo", LivesAt: boxtest.SelfB, Rev: boxtest.PeerRev(boxtest.SelfB)})
		return err
	}, "sleep failed", false},
	{"remove", "admin", func(ctx context.Context, b *box.Box, host string) error {
		return b.Remove(ctx, host, false)
	}, "saving and stopping its space failed", true},
	{"remove", "peer", func(ctx context.Context, b *box.Box, host string) error {
		_, err := b.ApplyTombstone(ctx, host, boxtest.PeerRev(boxtest.SelfB))
		return err
	}, "saving and stopping its space failed", true},
}

// TestChangesSettleTheSpace: a change that takes a space off this box does the same
// through either door: the space awake here is saved and stopped (and, the route removed,
// its local state dropped) before the call returns; a save that fails is the caller's
// error (500), the change stored and the space's writes kept here. Before, a peer's row
// slept the space in the background, so the call returned with the space still awake,
// and a peer's tombstone whose save failed was logged and answered as done.
func TestChangesSettleTheSpace(t *testing.T) {
	for _, tc := range changes {
		t.Run(tc.change+" via "+tc.door, func(t *testing.T) {
			const host = "c.mesh.test"
			b, bkt := boxtest.MeshSpace(t, host)
			if err := tc.do(t.Context(), b, host); err != nil {
				t.Fatal(err)
			}
			if boxtest.Awake(b, host) || !boxtest.Saved(t, bkt, host) || tc.gone && len(b.Spaces()) != 0 {
				t.Fatalf("after the call returned: awake %v, saved %v, spaces %v", boxtest.Awake(b, host), boxtest.Saved(t, bkt, host), b.Spaces())
			}
		})
		t.Run(tc.change+" via "+tc.door+", failed save", func(t *testing.T) {
			const host = "f.mesh.test"
			b, bkt := boxtest.MeshSpace(t, host)
			boxtest.FailSaves(bkt, host)
			err := tc.do(t.Context(), b, host)
			if box.StatusOf(err) != http.StatusInternalServerError || !strings.Contains(fmt.Sprint(err), tc.fails) {
				t.Fatalf("with the bucket cut off: %v (status %d), want a 500 saying %q", err, box.StatusOf(err), tc.fails)
			}
			if rt, ok := b.Lookup(host); ok == tc.gone || ok && rt.Hibernate {
				t.Fatalf("the change was not stored: row %v", rt)
			}
			if len(b.Spaces()) != 1 {
				t.Fatalf("after a failed save: spaces %v, want the local state kept", b.Spaces())
			}
		})
	}
}

// TestTombstoneSentAgainSettles: a peer's tombstone whose save failed settles when the
// sender tries it again, though the row is gone here by then (the tombstone is stale).
func TestTombstoneSentAgainSettles(t *testing.T) {
	const host = "again.mesh.test"
	b, bkt := boxtest.MeshSpace(t, host)
	boxtest.FailSaves(bkt, host)
	rev := boxtest.PeerRev(boxtest.SelfB)
	if _, err := b.ApplyTombstone(t.Context(), host, rev); err == nil {
		t.Fatal("a tombstone whose save failed was answered as done")
	}
	bkt.SetFail(nil)
	if res, err := b.ApplyTombstone(t.Context(), host, rev); err != nil || !res.Stale {
		t.Fatalf("the tombstone sent again: %+v %v, want stale and no error", res, err)
	}
	if len(b.Spaces()) != 0 || !boxtest.Saved(t, bkt, host) {
		t.Fatalf("after the tombstone was sent again: spaces %v, saved %v; want it saved and dropped", b.Spaces(), boxtest.Saved(t, bkt, host))
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
