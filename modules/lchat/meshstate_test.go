package lchat

import (
	"testing"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/mesh"
)

// withBox completes a meshState built by a test: the mesh.Box over its membership (no
// live members without one) and the replicator.
func withBox(ms *meshState) *meshState {
	live := func() []mesh.Member { return nil }
	var draining func() bool
	if ms.m != nil {
		live, draining = ms.m.Live, ms.m.Draining
	}
	ms.box = &mesh.Box{Self: ms.cfg.Self, Domains: ms.cfg.Domains, Region: ms.cfg.Region, Live: live, IsDraining: draining, Holders: new(mesh.Holders)}
	ms.repl = &mesh.Replicator{Box: ms.box, Client: ms.client, Ctx: ms.ctx}
	return ms
}

// testMesh is a meshState for handler tests (SELF http://127.0.0.9:1, domain mesh.test)
// and a context the embedded forward proxy provisions in: a running empty Caddy config,
// stopped when the test ends.
func testMesh(t *testing.T) (*meshState, caddy.Context) {
	t.Helper()
	cfg := mesh.Config{Self: "http://127.0.0.9:1", Domains: []string{"mesh.test"}, Token: "t0ken"}
	ms := withBox(&meshState{cfg: cfg, marker: mesh.Marker{Token: cfg.Token}, timeout: 5e9, logger: zap.NewNop()})
	if err := caddy.Load([]byte(`{"admin":{"disabled":true}}`), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
	cctx, cancel := caddy.NewContext(caddy.ActiveContext())
	t.Cleanup(cancel)
	return ms, cctx
}
