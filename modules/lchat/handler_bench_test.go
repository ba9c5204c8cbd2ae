package lchat

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/registry"
)

// TestMain doubles as an instance (boxtest.RunInstance) for the benchmark and the tests
// that wake spaces.
func TestMain(m *testing.M) {
	boxtest.RunInstance()
	os.Exit(m.Run())
}

// BenchmarkProxy compares one request through http.handlers.lchat to an awake space with
// the same request through a plain reverse_proxy to the same socket: the difference is
// lchat's own cost per request (lookup, acquire/release, dial address, idle bookkeeping).
func BenchmarkProxy(b *testing.B) {
	app := testApp(b, boxtest.Options{Settings: box.Settings{Kinds: boxtest.InstanceKinds(b)}})
	const host = "bench.example.com"
	rt, err := app.box.Create(context.Background(), registry.Spec{Host: host, Kind: "demo"})
	if err != nil {
		b.Fatal(err)
	}
	u, err := app.box.Acquire(context.Background(), &rt)
	if err != nil {
		b.Fatal(err)
	}
	sock := u.Socket()
	u.Release()

	if err := caddy.Load([]byte(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"WARN"}}}}`), true); err != nil {
		b.Fatal(err)
	}
	defer caddy.Stop()
	cctx, cancel := caddy.NewContext(caddy.ActiveContext())
	defer cancel()

	lc := &Handler{RetryAfter: caddy.Duration(5 * time.Second), app: app}
	if err := lc.provisionProxy(cctx, caddy.Duration(-1)); err != nil {
		b.Fatal(err)
	}
	defer lc.Cleanup()
	plain := &reverseproxy.Handler{Upstreams: reverseproxy.UpstreamPool{{Dial: "unix/" + sock}}, FlushInterval: -1}
	if err := plain.Provision(cctx); err != nil {
		b.Fatal(err)
	}
	defer plain.Cleanup()

	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	for _, bc := range []struct {
		name string
		h    caddyhttp.MiddlewareHandler
	}{{"reverse_proxy", plain}, {"lchat", lc}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					w := httptest.NewRecorder()
					req := caddyhttp.PrepareRequest(httptest.NewRequest("GET", "http://"+host+"/", nil), caddy.NewReplacer(), w, &caddyhttp.Server{})
					if err := bc.h.ServeHTTP(w, req, next); err != nil || w.Code != 200 {
						b.Fatalf("%d %v", w.Code, err)
					}
				}
			})
		})
	}
}
