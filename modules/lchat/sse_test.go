package lchat

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/gate"
	"github.com/lchat/lchat-caddy/held"
)

// TestPassSSEGatedReopenEndedByItsInstance: a held stream's reopen reaches an instance that
// answers a resumable stream and an event, both held at its output gate (its commits not yet
// durable), and then ends (a kill -9: the answer breaks off, the gate's wait fails). The
// client's response, under way since the first pass, is not cut: the pass ends as a cut
// stream, the client has had nothing of it, and the holder goes on by its Answer (a 503:
// the space is not served now). Caddy's proxy panics to abort a response its upstream broke
// off; before held.SSEWriter.Cut that panic reached the client's response here.
func TestPassSSEGatedReopenEndedByItsInstance(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set(connhold.SSEHeader, connhold.SSEResumable)
		fmt.Fprintf(w, "id: 2\ndata: after %s\n\n", r.Header.Get("Last-Event-ID"))
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // the instance is gone mid-answer
	}))
	defer upstream.Close()

	if err := caddy.Load([]byte(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}}}`), true); err != nil {
		t.Fatal(err)
	}
	defer caddy.Stop()
	cctx, cancel := caddy.NewContext(caddy.ActiveContext())
	defer cancel()
	proxy := &reverseproxy.Handler{Upstreams: reverseproxy.UpstreamPool{{Dial: strings.TrimPrefix(upstream.URL, "http://")}}, FlushInterval: -1}
	if err := proxy.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	defer proxy.Cleanup()

	// The first pass: a resumable stream under way, one event.
	client := httptest.NewRecorder()
	sw := held.NewSSEWriter(client, func() {})
	sw.Header().Set("Content-Type", "text/event-stream")
	sw.Header().Set(connhold.SSEHeader, connhold.SSEResumable)
	sw.WriteHeader(http.StatusOK)
	const ev1 = "id: 1\ndata: first\n\n"
	sw.Write([]byte(ev1))

	// The reopen, through a gate whose shipment never lands.
	g := gate.New(gate.Config{Cut: func(context.Context) (gate.Land, error) {
		return func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, nil
	}})
	defer g.Close(nil)
	sw.Reopen(func() {})
	r := httptest.NewRequest("GET", "http://space.example.com/events", nil)
	r.Header.Set("Last-Event-ID", "1")
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), client, &caddyhttp.Server{})
	gw := gate.NewWriter(r.Context(), sw, g, gate.WriterConfig{Timeout: 100 * time.Millisecond})
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })

	var err error
	func() {
		defer func() {
			if v := recover(); v != nil {
				t.Fatalf("the pass panicked (%v): the client's stream would be cut", v)
			}
		}()
		err = passSSE(sw, gw, r, proxy, next)
		gw.Finish()
	}()
	if !errors.Is(err, errStreamCut) {
		t.Errorf("passSSE = %v, want errStreamCut", err)
	}
	if status, resumable := sw.Answer(); status != http.StatusServiceUnavailable || resumable {
		t.Errorf("the pass's Answer = %d, %v; want the gate's 503, not resumable", status, resumable)
	}
	if got := client.Body.String(); got != ev1 || client.Code != http.StatusOK {
		t.Errorf("the client has %d %q; want the first pass's 200 %q only", client.Code, got, ev1)
	}
}
