package connhold

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/gobwas/ws"
)

// Held messages at the sizes where the box's buffers and caps have their edges, through
// the box's real paths: the client's frames read by the hub, each event POSTed by the
// EventClient to an instance's HTTP server on a Unix socket, its answer parsed and
// written back to the client.

// edgeSizes are message sizes around a 4 KiB read (the reader's chunk, the EventClient's
// buffers), Go's server's 256 KiB of unread body it discards, and the largest message.
var edgeSizes = []int{4095, 4096, 4097, 5000, 256<<10 - 1, 256 << 10, 256<<10 + 1, 1<<20 - 1, 1 << 20}

// echoEncoding answers each event with the message in one of the answer encodings.
type echoEncoding struct {
	name   string
	binary bool // the client sends and gets binary messages
	answer func(w http.ResponseWriter, payload []byte)
}

var echoEncodings = []echoEncoding{
	{"websocket-events TEXT", false, func(w http.ResponseWriter, p []byte) {
		w.Header().Set("Content-Type", EventsContentType)
		w.Write(AppendEvent(nil, Message{Payload: p}))
	}},
	{"websocket-events BINARY", true, func(w http.ResponseWriter, p []byte) {
		w.Header().Set("Content-Type", EventsContentType)
		w.Write(AppendEvent(nil, Message{Binary: true, Payload: p}))
	}},
	{"octet-stream", true, func(w http.ResponseWriter, p []byte) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(p)
	}},
	{"text", false, func(w http.ResponseWriter, p []byte) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write(p)
	}},
}

// sizedMessage is n bytes a client can send as text or binary: ASCII that differs along
// its length, so a cut or shifted message shows.
func sizedMessage(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte((i+i/26)%26)
	}
	return b
}

// TestEveryMessageSizeReachesTheAppAndComesBackWhole: a client's message of each edge
// size, up to the largest (MaxMessage), reaches the instance whole, and the instance's
// answer of the same size comes back whole in every answer encoding, whether the instance
// read the body (an echo) or answered without reading it (its answer made from the
// Content-Length alone): an answered event is delivered, never retried.
func TestEveryMessageSizeReachesTheAppAndComesBackWhole(t *testing.T) {
	for _, enc := range echoEncodings {
		for _, reads := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/reads=%v", enc.name, reads), func(t *testing.T) {
				var mu sync.Mutex
				var got [][]byte
				tb := newPostBox(t, Limits{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get(EventHeader) == string(KindClose) {
						return
					}
					payload := sizedMessage(int(r.ContentLength))
					if reads {
						b, err := io.ReadAll(r.Body)
						if err != nil {
							http.Error(w, err.Error(), http.StatusBadRequest)
							return
						}
						mu.Lock()
						got = append(got, b)
						mu.Unlock()
						payload = b
					}
					enc.answer(w, payload)
				}))
				c := tb.dial(t, nil)
				typ := websocket.MessageText
				if enc.binary {
					typ = websocket.MessageBinary
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				for _, n := range edgeSizes {
					msg := sizedMessage(n)
					if err := c.Write(ctx, typ, msg); err != nil {
						t.Fatalf("%d bytes: writing: %v", n, err)
					}
					gotTyp, echo, err := c.Read(ctx)
					if err != nil {
						t.Fatalf("%d bytes: no answer: %v", n, err)
					}
					if gotTyp != typ || !bytes.Equal(echo, msg) {
						t.Fatalf("%d bytes: the answer came back as %v of %d bytes, not whole", n, gotTyp, len(echo))
					}
				}
				if reads {
					mu.Lock()
					defer mu.Unlock()
					for i, n := range edgeSizes {
						if i >= len(got) || !bytes.Equal(got[i], sizedMessage(n)) {
							t.Fatalf("the instance did not get the %d-byte message whole", n)
						}
					}
				}
				if s := tb.hub.Stats(); s.DeliveryErrors != 0 || s.Redelivered != 0 {
					t.Errorf("%d failed deliveries, %d redeliveries: every event was answered", s.DeliveryErrors, s.Redelivered)
				}
			})
		}
	}
}

// TestMessageOnePastTheLargestIs1009: one byte past MaxMessage closes the client with
// 1009, and the instance hears of it as the connection's close.
func TestMessageOnePastTheLargestIs1009(t *testing.T) {
	closes := make(chan string, 1)
	tb := newPostBox(t, Limits{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(EventHeader) == string(KindClose) {
			closes <- r.Header.Get(CloseCodeHeader)
			return
		}
		io.Copy(io.Discard, r.Body)
	}))
	rc := tb.dialRaw(t)
	// The box refuses the message at its header: the rest may not be taken.
	go func() {
		ws.WriteHeader(rc.nc, ws.Header{Fin: true, OpCode: ws.OpBinary, Length: 1<<20 + 1, Masked: true})
		rc.nc.Write(sizedMessage(1<<20 + 1))
	}()
	if got := rc.readClose(t); got != CloseTooBig {
		t.Errorf("close %d, want 1009", got)
	}
	select {
	case code := <-closes:
		if code != strconv.Itoa(CloseTooBig) {
			t.Errorf("the instance's close event says %s, want 1009", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no close event reached the instance")
	}
}

// TestAppMessagesPastTheOutboundCapReachAReadingClient: the slow-reader cap (MaxOutBytes)
// bounds what a client has not read, not one message: an answer one byte past the cap,
// and larger, and the same sent through the control endpoint, reach a client that reads,
// while it pings (its pongs queue behind the large frame).
func TestAppMessagesPastTheOutboundCapReachAReadingClient(t *testing.T) {
	tb := newPostBox(t, Limits{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		n, _ := strconv.Atoi(string(b))
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(sizedMessage(n))
	}))
	c := tb.dial(t, nil)
	id := tb.lastID()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pinging := make(chan struct{})
	go func() {
		defer close(pinging)
		for ctx.Err() == nil {
			if c.Ping(ctx) != nil {
				return
			}
		}
	}()
	read := func(n int, what string) {
		t.Helper()
		typ, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("%s of %d bytes: %v", what, n, err)
		}
		if typ != websocket.MessageBinary || !bytes.Equal(b, sizedMessage(n)) {
			t.Fatalf("%s of %d bytes: got %d bytes", what, n, len(b))
		}
	}
	for _, n := range []int{1 << 20, 1<<20 + 1, 1<<20 + 11, 2 << 20} {
		write(t, c, strconv.Itoa(n))
		read(n, "the answer")
		if err := tb.hub.Send("s1", id, Message{Binary: true, Payload: sizedMessage(n)}); err != nil {
			t.Fatalf("sending %d bytes: %v", n, err)
		}
		read(n, "the control endpoint's message")
	}
	cancel()
	<-pinging
	if got := tb.hub.Stats().Closes[ClosePolicy]; got != 0 {
		t.Errorf("%d clients closed as slow readers", got)
	}
}

// TestLargestAnswer: an answer's body may be up to MaxAnswer, in any encoding, and is
// parsed whole; one byte more is not an acknowledgement (a failed delivery).
func TestLargestAnswer(t *testing.T) {
	big := sizedMessage(MaxAnswer - len("TEXT ffffff\r\n\r\n")) // its event is MaxAnswer bytes
	if n := len(AppendEvent(nil, Message{Payload: big})); n != MaxAnswer {
		t.Fatalf("the event is %d bytes", n)
	}
	cases := []struct {
		name, ctype string
		body        []byte
		want        []byte
	}{
		{"octet-stream", "application/octet-stream", sizedMessage(MaxAnswer), sizedMessage(MaxAnswer)},
		{"websocket-events", EventsContentType, AppendEvent(nil, Message{Payload: big}), big},
		{"octet-stream one past", "application/octet-stream", sizedMessage(MaxAnswer + 1), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := unixInstance(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				w.Write(tc.body)
			}))
			r, err := PostEvent(context.Background(), &EventClient{Socket: sock}, "http://s1", Event{Kind: KindText, Payload: []byte("x")})
			if tc.want == nil {
				if err == nil {
					t.Errorf("an answer of %d bytes acknowledged the event", len(tc.body))
				}
				return
			}
			if err != nil {
				t.Fatalf("an answer of %d bytes: %v", len(tc.body), err)
			}
			if len(r.Messages) != 1 || !bytes.Equal(r.Messages[0].Payload, tc.want) {
				t.Errorf("the %d-byte answer's message did not come back whole", len(tc.body))
			}
		})
	}
}
