package connhold

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// roundTripInstance is an instance on a Unix socket that answers each event POST inline
// with its message, and echoes the messages of a WebSocket it terminates itself (the
// tunnel's far end); more adds handlers.
func roundTripInstance(tb testing.TB, more func(*http.ServeMux)) string {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+EventPath, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	})
	if more != nil {
		more(mux)
	}
	mux.HandleFunc("GET /tunnel", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(context.Background())
			if err != nil {
				return
			}
			if c.Write(context.Background(), typ, b) != nil {
				return
			}
		}
	})
	return unixInstance(tb, mux)
}

// BenchmarkHeldRoundTrip is a message's round trip to an awake instance through a held
// connection (the hub reads the frame, POSTs the event, writes the inline answer) against
// today's tunnel (a reverse proxy copying bytes to the instance's own WebSocket), side by
// side: the round trips alternate, with a third, the event POST alone, and the figures are
// each one's median (µs) and the ratios. Neither path includes the engine (box.Serve) or
// Caddy. The POST is the hop the held path adds; (tunnel+post)/tunnel is what the held
// path would cost with nothing of the hub's own.
//
//	go test ./connhold -run '^$' -bench HeldRoundTrip -benchtime 5000x
func BenchmarkHeldRoundTrip(b *testing.B) {
	sock := roundTripInstance(b, nil)
	roundTrip, held, tun := roundTripRig(b, sock, postDeliverer{&EventClient{Socket: sock}})
	ctx := context.Background()
	msg := []byte("x")
	// The event POST alone, as the hub sends it, with a client of its own.
	post := postDeliverer{&EventClient{Socket: sock}}
	ev := Event{Space: "s1", ConnID: NewID(), Kind: KindText, Payload: msg}
	postOnly := func() time.Duration {
		start := time.Now()
		ev.Seq++
		if r, err := post.Deliver(ctx, ev); err != nil || len(r.Messages) != 1 {
			b.Fatalf("POST: %+v %v", r, err)
		}
		return time.Since(start)
	}
	for range 100 { // warm all three: connections to the instance, buffers
		roundTrip(held)
		roundTrip(tun)
		postOnly()
	}
	var hs, ts, ps []time.Duration
	b.ResetTimer()
	for b.Loop() {
		hs = append(hs, roundTrip(held))
		ts = append(ts, roundTrip(tun))
		ps = append(ps, postOnly())
	}
	b.StopTimer()
	h, t, p := medianMicros(hs), medianMicros(ts), medianMicros(ps)
	b.ReportMetric(h, "held-µs")
	b.ReportMetric(t, "tunnel-µs")
	b.ReportMetric(p, "post-µs")
	b.ReportMetric(h/t, "held/tunnel")
	b.ReportMetric((t+p)/t, "(tunnel+post)/tunnel")
	b.ReportMetric(0, "ns/op")
}

// roundTripRig is a box for the round-trip benchmarks: a hub delivering with d, and
// today's tunnel (a reverse proxy to the instance at sock); held and tun are a client's
// WebSocket through each, and roundTrip times one message's answer on either.
func roundTripRig(b *testing.B, sock string, d Deliverer) (roundTrip func(*websocket.Conn) time.Duration, held, tun *websocket.Conn) {
	var dl net.Dialer
	dialInstance := func(ctx context.Context, _, _ string) (net.Conn, error) { return dl.DialContext(ctx, "unix", sock) }
	hub, err := NewHub(Limits{}, d, nil)
	if err != nil {
		b.Fatal(err)
	}
	// A checkpoint as the engine runs one when asked: what it covers is dropped.
	hub.NeedCheckpoint = func(space string, _ At) {
		go hub.CheckpointDone(space, hub.CheckpointStarted(space))
	}
	up, _ := url.Parse("http://instance")
	tunnel := httputil.NewSingleHostReverseProxy(up)
	tunnel.Transport = &http.Transport{DialContext: dialInstance}
	box := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tunnel" {
			tunnel.ServeHTTP(w, r)
			return
		}
		if _, err := hub.Accept(w, r, "s1", NewID(), Reply{}, ""); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	}))
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hub.Shutdown(ctx, CloseServiceRestart)
		box.Close()
	})

	ctx := context.Background()
	dial := func(path string) *websocket.Conn {
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(box.URL, "http")+path, nil)
		if err != nil {
			b.Fatalf("dialing %s: %v", path, err)
		}
		b.Cleanup(func() { c.CloseNow() })
		return c
	}
	held, tun = dial("/held"), dial("/tunnel")
	msg := []byte("x")
	roundTrip = func(c *websocket.Conn) time.Duration {
		start := time.Now()
		if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
			b.Fatal(err)
		}
		if _, got, err := c.Read(ctx); err != nil || string(got) != "x" {
			b.Fatalf("answer %q, %v", got, err)
		}
		return time.Since(start)
	}
	return roundTrip, held, tun
}

// medianMicros is d's median in µs.
func medianMicros(d []time.Duration) float64 {
	slices.Sort(d)
	return float64(d[len(d)/2].Nanoseconds()) / 1e3
}
