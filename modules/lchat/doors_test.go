package lchat

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/bucket/membucket"
)

// doorsApp is the app of box A of a two-box mesh (boxtest.MeshBox) with a space awake on
// it, its admin API and its peer API.
func doorsApp(t *testing.T, host string) (*adminAPI, *MeshAPI, *membucket.Counting) {
	t.Helper()
	b, bkt := boxtest.MeshBox(t)
	app := &App{box: b}
	a, h := &adminAPI{app: app}, &MeshAPI{app: app, MaxRowBytes: 4096}
	if code, msg := adminDo(a, "POST", "/lchat/routes", map[string]any{"host": host, "kind": "demo"}); code != http.StatusCreated {
		t.Fatalf("creating %s: %d %s", host, code, msg)
	}
	boxtest.Wake(t, b, host)
	return a, h, bkt
}

// peerDo sends a peer request from B with the mesh token.
func peerDo(h *MeshAPI, method, path string, body any) (int, string) {
	raw := ""
	if body != nil {
		b, _ := json.Marshal(body)
		raw = string(b)
	}
	return meshAPIDo(h, method, path, "Bearer "+boxtest.Token, raw)
}

// TestHibernateOffThroughBothDoors: hibernation turned off by the operator
// (POST /lchat/routes/{host}/hibernate) and by a peer's row pinning the space to it
// (PUT /api/mesh/route/{host}) does the same: the answer comes once the space awake here
// is asleep and saved, and a save that fails is a 500 through both. Before, the peer's
// row was answered 200 at once and the space slept in the background, a failure logged.
func TestHibernateOffThroughBothDoors(t *testing.T) {
	doors := []struct {
		door string
		off  func(a *adminAPI, h *MeshAPI, host string) (int, string)
	}{
		{"admin API", func(a *adminAPI, _ *MeshAPI, host string) (int, string) {
			return adminDo(a, "POST", "/lchat/routes/"+host+"/hibernate", map[string]any{"hibernate": false, "upstream": "127.0.0.1:9"})
		}},
		{"peer API", func(_ *adminAPI, h *MeshAPI, host string) (int, string) {
			return peerDo(h, "PUT", "/api/mesh/route/"+host, map[string]any{"host": host, "kind": "demo", "hibernate": false,
				"lives_at": boxtest.SelfB, "rev": boxtest.PeerRev(boxtest.SelfB)})
		}},
	}
	for _, tc := range doors {
		t.Run(tc.door, func(t *testing.T) {
			const host = "flip.mesh.test"
			a, h, bkt := doorsApp(t, host)
			if code, msg := tc.off(a, h, host); code != http.StatusOK {
				t.Fatalf("turning hibernation off: %d %s", code, msg)
			}
			if boxtest.Awake(a.app.box, host) || !boxtest.Saved(t, bkt, host) {
				t.Fatalf("after the answer: awake %v, saved %v; want asleep and saved", boxtest.Awake(a.app.box, host), boxtest.Saved(t, bkt, host))
			}
		})
		t.Run(tc.door+", failed save", func(t *testing.T) {
			const host = "flipfail.mesh.test"
			a, h, bkt := doorsApp(t, host)
			boxtest.FailSaves(bkt, host)
			if code, msg := tc.off(a, h, host); code != http.StatusInternalServerError || !strings.Contains(msg, "sleep failed") {
				t.Fatalf("turning hibernation off with the bucket cut off: %d %s, want a 500 saying the sleep failed", code, msg)
			}
		})
	}
}

// TestRemoveThroughBothDoors: a route removed by the operator (DELETE /lchat/routes/{host})
// and by a peer's tombstone (DELETE /api/mesh/route/{host}) does the same: the answer
// comes once the space is saved and its local state dropped, and a save that fails is a
// 500 through both, the local state kept. Before, the peer's tombstone was answered 200
// whatever became of the save, which was only logged.
func TestRemoveThroughBothDoors(t *testing.T) {
	doors := []struct {
		door   string
		remove func(a *adminAPI, h *MeshAPI, host string) (int, string)
	}{
		{"admin API", func(a *adminAPI, _ *MeshAPI, host string) (int, string) {
			return adminDo(a, "DELETE", "/lchat/routes/"+host, nil)
		}},
		{"peer API", func(_ *adminAPI, h *MeshAPI, host string) (int, string) {
			req := meshAPIRequest("DELETE", "/api/mesh/route/"+host, "Bearer "+boxtest.Token, "")
			req.Header.Set("X-Lchat-Rev", boxtest.PeerRev(boxtest.SelfB))
			return meshAPIServe(h, req)
		}},
	}
	for _, tc := range doors {
		t.Run(tc.door, func(t *testing.T) {
			const host = "rm.mesh.test"
			a, h, bkt := doorsApp(t, host)
			if code, msg := tc.remove(a, h, host); code != http.StatusOK {
				t.Fatalf("removing: %d %s", code, msg)
			}
			if len(a.app.box.Spaces()) != 0 || !boxtest.Saved(t, bkt, host) {
				t.Fatalf("after the answer: spaces %v, saved %v; want it saved and dropped", a.app.box.Spaces(), boxtest.Saved(t, bkt, host))
			}
		})
		t.Run(tc.door+", failed save", func(t *testing.T) {
			const host = "rmfail.mesh.test"
			a, h, bkt := doorsApp(t, host)
			boxtest.FailSaves(bkt, host)
			if code, msg := tc.remove(a, h, host); code != http.StatusInternalServerError || !strings.Contains(msg, "saving and stopping its space failed") {
				t.Fatalf("removing with the bucket cut off: %d %s, want a 500 saying the save failed", code, msg)
			}
			if len(a.app.box.Spaces()) != 1 {
				t.Fatalf("after a failed save: spaces %v, want the local state kept", a.app.box.Spaces())
			}
		})
	}
}
