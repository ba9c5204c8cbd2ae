package lchat

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/registry"
)

// TestMain doubles as a tiny instance for the handler benchmark: with
// LCHAT_HANDLER_TEST_INSTANCE=1 this binary answers "ok" on $LCHAT_SOCKET until killed.
func TestMain(m *testing.M) {
	if os.Getenv("LCHAT_HANDLER_TEST_INSTANCE") == "1" {
		ln, err := net.Listen("unix", os.Getenv("LCHAT_SOCKET"))
		if err != nil {
			os.Exit(1)
		}
		http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// BenchmarkProxy compares one request through http.handlers.lchat to an awake space with
// the same request through a plain reverse_proxy to the same socket: the difference is
// lchat's own cost per request (lookup, acquire/release, dial address, idle bookkeeping).
func BenchmarkProxy(b *testing.B) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "hb")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	reg, err := registry.Open(filepath.Join(dir, "reg.db"), registry.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Close()
	bkt, err := filebucket.New(filepath.Join(dir, "bucket"))
	if err != nil {
		b.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Bucket: bkt, StateDir: filepath.Join(dir, "s"), Holder: "box", Incarnation: "1",
		Kinds: map[string]engine.Kind{"app": {Command: self, Env: map[string]string{"LCHAT_HANDLER_TEST_INSTANCE": "1"},
			Replication: engine.Replication{Class: engine.ReplicateSleep}, IdleTimeout: time.Hour, StopGrace: time.Second}}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		eng.Drain(ctx)
		eng.Close()
	}()
	const host = "bench.example.com"
	if _, err := reg.Put(registry.Route{Host: host, Kind: "app", Hibernate: true}); err != nil {
		b.Fatal(err)
	}
	u, err := eng.Acquire(context.Background(), engine.Space{Host: host, Kind: "app"})
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

	lc := &Handler{RetryAfter: caddy.Duration(5 * time.Second), app: &App{shared: &shared{reg: reg, eng: eng}}}
	lc.logger = zap.NewNop()
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
