package connhold

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// framedInstance is an instance taking events as messages of one WebSocket the box would
// open to it (/.lchat/ws/stream): each message an event's headers (as the POST's), a blank
// line and its payload; each answer the same with the connection id and sequence number it
// answers. Not the contract: the measurement behind not building it (see
// BenchmarkFramedRoundTrip).
func framedInstance(tb testing.TB) string {
	return roundTripInstance(tb, func(mux *http.ServeMux) {
		mux.HandleFunc("GET /.lchat/ws/stream", func(w http.ResponseWriter, r *http.Request) {
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			c.SetReadLimit(-1)
			defer c.CloseNow()
			for {
				_, b, err := c.Read(context.Background())
				if err != nil {
					return
				}
				// Answered inline, one at a time (a goroutine per message cost more).
				tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(b)))
				h, _ := tp.ReadMIMEHeader()
				i := bytes.Index(b, []byte("\r\n\r\n"))
				var out bytes.Buffer
				out.WriteString("Lchat-Conn-Id: " + h.Get("Lchat-Conn-Id") + "\r\nLchat-Seq: " + h.Get("Lchat-Seq") + "\r\nStatus: 200\r\n\r\n")
				out.Write(b[i+4:])
				if c.Write(context.Background(), websocket.MessageBinary, out.Bytes()) != nil {
					return
				}
			}
		})
	})
}

// framedDeliverer sends each event as a message of one WebSocket to the instance, and a
// reader hands each answer to the delivery waiting for it.
type framedDeliverer struct {
	c       *websocket.Conn
	wmu     sync.Mutex
	mu      sync.Mutex
	waiting map[string]chan []byte
}

func newFramed(tb testing.TB, sock string) *framedDeliverer {
	var d net.Dialer
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "unix", sock) }}}
	c, _, err := websocket.Dial(context.Background(), "ws://s1/.lchat/ws/stream", &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		tb.Fatal(err)
	}
	c.SetReadLimit(-1)
	f := &framedDeliverer{c: c, waiting: map[string]chan []byte{}}
	go func() {
		for {
			_, b, err := c.Read(context.Background())
			if err != nil {
				return
			}
			i := bytes.Index(b, []byte("\r\n\r\n"))
			tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(b[:i+4])))
			h, _ := tp.ReadMIMEHeader()
			k := h.Get("Lchat-Conn-Id") + " " + h.Get("Lchat-Seq")
			f.mu.Lock()
			ch := f.waiting[k]
			delete(f.waiting, k)
			f.mu.Unlock()
			if ch != nil {
				ch <- b[i+4:]
			}
		}
	}()
	return f
}

func (f *framedDeliverer) Deliver(ctx context.Context, ev Event) (Reply, error) {
	var b bytes.Buffer
	b.WriteString("Lchat-Conn-Id: " + ev.ConnID + "\r\nLchat-Seq: " + strconv.FormatUint(ev.Seq, 10) + "\r\nLchat-Event: " + string(ev.Kind) + "\r\n\r\n")
	b.Write(ev.Payload)
	ch := make(chan []byte, 1)
	k := ev.ConnID + " " + strconv.FormatUint(ev.Seq, 10)
	f.mu.Lock()
	f.waiting[k] = ch
	f.mu.Unlock()
	f.wmu.Lock()
	err := f.c.Write(ctx, websocket.MessageBinary, b.Bytes())
	f.wmu.Unlock()
	if err != nil {
		return Reply{}, err
	}
	body := <-ch
	return Reply{Messages: []Message{{Payload: body}}}, nil
}

// BenchmarkFramedRoundTrip is BenchmarkHeldRoundTrip with the event carried as a message
// of one kept WebSocket to the instance instead of an HTTP POST: what a framed awake
// transport (a second contract for apps) would reach, against the tunnel, side by side.
// It is the measurement behind not building one (docs/connections.md, "Not yet"): it
// reached 1.5-1.9x the tunnel where the POST reached 1.8-2.2x, in the same runs.
//
//	go test ./connhold -run '^$' -bench 'HeldRoundTrip|FramedRoundTrip' -benchtime 5000x -count 3
func BenchmarkFramedRoundTrip(b *testing.B) {
	sock := framedInstance(b)
	roundTrip, held, tun := roundTripRig(b, sock, newFramed(b, sock))
	for range 100 {
		roundTrip(held)
		roundTrip(tun)
	}
	var hs, ts []time.Duration
	b.ResetTimer()
	for b.Loop() {
		hs = append(hs, roundTrip(held))
		ts = append(ts, roundTrip(tun))
	}
	b.StopTimer()
	h, t := medianMicros(hs), medianMicros(ts)
	b.ReportMetric(h, "framed-µs")
	b.ReportMetric(t, "tunnel-µs")
	b.ReportMetric(h/t, "framed/tunnel")
	b.ReportMetric(0, "ns/op")
}
