package lchat

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/mesh"
)

// doorsApp is the app of box A of a two-box mesh with host's space awake on it
// (boxtest.MeshSpace), its admin API and its peer API.
func doorsApp(t *testing.T, host string) (*adminAPI, *MeshAPI, *membucket.Counting) {
	t.Helper()
	b, bkt := boxtest.MeshSpace(t, host)
	app := &App{box: b}
	return &adminAPI{appRef{app}}, &MeshAPI{app: app, MaxRowBytes: 4096}, bkt
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

// changes are the route changes that take a space off this box, each through its
// operator's door (the admin API) and its peer's (the peer API): turning hibernation off
// (POST /lchat/routes/{host}/hibernate; a row pinning the space to another box, PUT
// /api/mesh/route/{host}) and removing the route (DELETE /lchat/routes/{host}; a
// tombstone, DELETE /api/mesh/route/{host}).
var changes = []struct {
	change, door string
	do           func(a *adminAPI, h *MeshAPI, host string) (int, string)
	fails        string // what the answer to a failed save says
}{
	{"hibernate off", "admin API", func(a *adminAPI, _ *MeshAPI, host string) (int, string) {
		return adminDo(a, "POST", "/lchat/routes/"+host+"/hibernate", map[string]any{"hibernate": false, "upstream": "127.0.0.1:9"})
	}, "sleep failed"},
	{"hibernate off", "peer API", func(_ *adminAPI, h *MeshAPI, host string) (int, string) {
		return peerDo(h, "PUT", "/api/mesh/route/"+host, map[string]any{"host": host, "kind": "demo", "hibernate": false,
			"lives_at": boxtest.SelfB, "rev": boxtest.PeerRev(boxtest.SelfB)})
	}, "sleep failed"},
	{"remove", "admin API", func(a *adminAPI, _ *MeshAPI, host string) (int, string) {
		return adminDo(a, "DELETE", "/lchat/routes/"+host, nil)
	}, "saving and stopping its space failed"},
	{"remove", "peer API", func(_ *adminAPI, h *MeshAPI, host string) (int, string) {
		req := meshAPIRequest("DELETE", "/api/mesh/route/"+host, "Bearer "+boxtest.Token, "")
		req.Header.Set(mesh.RevHeader, boxtest.PeerRev(boxtest.SelfB))
		return meshAPIServe(h, req)
	}, "saving and stopping its space failed"},
}

// TestChangesThroughBothDoors: a change that takes a space off this box is answered
// through either door once the space awake here is saved and stopped (200), and a save
// that fails is a 500 through either door. Before, the peer API answered a row pinning
// the space elsewhere at once and slept it in the background, and answered 200 to a
// tombstone whose save failed, which was only logged.
func TestChangesThroughBothDoors(t *testing.T) {
	for _, tc := range changes {
		t.Run(tc.change+" via "+tc.door, func(t *testing.T) {
			const host = "c.mesh.test"
			a, h, bkt := doorsApp(t, host)
			if code, msg := tc.do(a, h, host); code != http.StatusOK {
				t.Fatalf("%d %s", code, msg)
			}
			if boxtest.Awake(a.app.box, host) || !boxtest.Saved(t, bkt, host) {
				t.Fatalf("after the answer: awake %v, saved %v; want asleep and saved", boxtest.Awake(a.app.box, host), boxtest.Saved(t, bkt, host))
			}
		})
		t.Run(tc.change+" via "+tc.door+", failed save", func(t *testing.T) {
			const host = "f.mesh.test"
			a, h, bkt := doorsApp(t, host)
			boxtest.FailSaves(bkt, host)
			if code, msg := tc.do(a, h, host); code != http.StatusInternalServerError || !strings.Contains(msg, tc.fails) {
				t.Fatalf("with the bucket cut off: %d %s, want a 500 saying %q", code, msg, tc.fails)
			}
		})
	}
}
