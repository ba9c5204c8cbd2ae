package lchat

import (
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/mesh"
)

// testMesh is an app whose box is in a mesh, for handler tests (SELF http://127.0.0.9:1,
// domain mesh.test), and a context the embedded forward proxy provisions in: a running
// empty Caddy config, stopped when the test ends.
func testMesh(t *testing.T) (*App, caddy.Context) {
	t.Helper()
	app := testApp(t, boxtest.Options{Mesh: mesh.Config{Self: "http://127.0.0.9:1", Domains: []string{"mesh.test"}, Token: "t0ken"}})
	return app, caddyContext(t)
}

// caddyContext is a context of a running empty Caddy config, stopped when the test ends.
func caddyContext(t testing.TB) caddy.Context {
	t.Helper()
	if err := caddy.Load([]byte(`{"admin":{"disabled":true}}`), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
	cctx, cancel := caddy.NewContext(caddy.ActiveContext())
	t.Cleanup(cancel)
	return cctx
}
