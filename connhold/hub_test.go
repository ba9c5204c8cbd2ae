package connhold

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"github.com/gobwas/ws"

	"github.com/lchat/lchat-caddy/internal/testwait"
)

func TestParkedConnectionsAnswerPingsWithNoGoroutine(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			tb := newTestBox(t, Limits{}, useTLS)
			const n = 20
			conns := make([]*websocket.Conn, n)
			for i := range conns {
				conns[i] = tb.dial(t, nil)
			}
			testwait.WaitFor(t, 10*time.Second, "every connection parked", func() bool { return tb.hub.Stats().Parked == n })
			testwait.WaitFor(t, 10*time.Second, "no connection goroutine", func() bool { return connholdGoroutines() == 0 })

			// A ping wakes a reader only for as long as it takes to answer it.
			c := conns[3]
			c.CloseRead(context.Background()) // the client reads (pongs) in the background
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for range 3 {
				if err := c.Ping(ctx); err != nil {
					t.Fatalf("ping: %v", err)
				}
			}
			if got := tb.hub.Stats().Pings; got != 3 {
				t.Errorf("box answered %d pings, want 3", got)
			}
			testwait.WaitFor(t, 10*time.Second, "the pinged connection parked again", func() bool { return tb.hub.Stats().Parked == n })
			testwait.WaitFor(t, 10*time.Second, "no connection goroutine after the pings", func() bool { return connholdGoroutines() == 0 })
			if evs := tb.app.all(); len(evs) != 0 {
				t.Errorf("pings reached the instance: %v", evs)
			}
		})
	}
}

func TestMessagesReachTheInstanceInOrderAndRepliesReachTheClient(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			tb := newTestBox(t, Limits{}, useTLS)
			tb.app.reply = func(ev Event) Reply {
				if ev.Kind == KindClose {
					return Reply{}
				}
				return Reply{Messages: []Message{{Payload: []byte("echo " + string(ev.Payload))}}}
			}
			c := tb.dial(t, nil)
			testwait.WaitFor(t, 10*time.Second, "parked", func() bool { return tb.hub.Stats().Parked == 1 })
			const n = 50
			for i := range n {
				write(t, c, fmt.Sprintf("m%d", i))
			}
			for i := range n {
				if _, got := readMsg(t, c); got != fmt.Sprintf("echo m%d", i) {
					t.Fatalf("reply %d: %q", i, got)
				}
			}
			// A binary message, split in fragments by the client, arrives whole.
			big := bytes.Repeat([]byte("0123456789"), 3000)
			if err := c.Write(context.Background(), websocket.MessageBinary, big); err != nil {
				t.Fatal(err)
			}
			readMsg(t, c)
			evs := tb.app.all()
			if len(evs) != n+1 {
				t.Fatalf("%d events, want %d", len(evs), n+1)
			}
			for i, ev := range evs[:n] {
				if ev.Seq != uint64(i+1) || string(ev.Payload) != fmt.Sprintf("m%d", i) || ev.Kind != KindText || ev.Redelivery || ev.ConnID != tb.lastID() {
					t.Fatalf("event %d: %+v", i, ev)
				}
			}
			if last := evs[n]; last.Kind != KindBinary || !bytes.Equal(last.Payload, big) || last.Seq != n+1 {
				t.Fatalf("binary event: kind %s seq %d %d bytes", last.Kind, last.Seq, len(last.Payload))
			}
			c.Close(websocket.StatusNormalClosure, "bye")
			ev := tb.app.next(t)
			for ev.Kind != KindClose {
				ev = tb.app.next(t)
			}
			if ev.CloseCode != 1000 || string(ev.Payload) != "bye" || ev.Seq != n+2 {
				t.Errorf("close event: %+v", ev)
			}
		})
	}
}

func TestFailedDeliveryIsRedeliveredWithItsSequenceNumber(t *testing.T) {
	tb := newTestBox(t, Limits{RetryFirst: time.Millisecond}, false)
	failed := false
	tb.app.fail = func(ev Event) bool {
		if ev.Seq == 2 && !failed {
			failed = true
			return true
		}
		return false
	}
	c := tb.dial(t, nil)
	for _, m := range []string{"a", "b", "c"} {
		write(t, c, m)
	}
	testwait.WaitFor(t, 10*time.Second, "four deliveries", func() bool { return len(tb.app.all()) == 4 })
	type d struct {
		seq   uint64
		body  string
		redel bool
	}
	var got []d
	for _, ev := range tb.app.all() {
		got = append(got, d{ev.Seq, string(ev.Payload), ev.Redelivery})
	}
	want := []d{{1, "a", false}, {2, "b", false}, {2, "b", true}, {3, "c", false}}
	if !slices.Equal(got, want) {
		t.Errorf("deliveries %v, want %v", got, want)
	}
}

func TestCrashRedeliversWhatNoCheckpointCovered(t *testing.T) {
	tb := newTestBox(t, Limits{}, false)
	c := tb.dial(t, nil)
	write(t, c, "a")
	write(t, c, "b")
	testwait.WaitFor(t, 10*time.Second, "a and b acknowledged", func() bool { return tb.hub.Stats().Delivered == 2 })
	mark := tb.hub.CheckpointStarted("s1") // a checkpoint begins: a and b are in it
	write(t, c, "c")                       // acknowledged during the checkpoint: not in it
	testwait.WaitFor(t, 10*time.Second, "c acknowledged", func() bool { return tb.hub.Stats().Delivered == 3 })
	tb.hub.CheckpointDone("s1", mark)
	if l := tb.hub.List("s1", ""); len(l) != 1 || l[0].Pending != 1 {
		t.Fatalf("after the checkpoint: %+v, want c alone pending", l)
	}
	tb.hub.InstanceGone("s1") // the instance crashed
	testwait.WaitFor(t, 10*time.Second, "c redelivered", func() bool { return len(tb.app.all()) == 4 })
	ev := tb.app.all()[3]
	if string(ev.Payload) != "c" || ev.Seq != 3 || !ev.Redelivery {
		t.Errorf("redelivery %+v, want c seq 3 redelivered", ev)
	}
	// The next instance's checkpoint covers it; a clean stop redelivers nothing.
	tb.hub.CheckpointDone("s1", tb.hub.CheckpointStarted("s1"))
	tb.hub.InstanceGone("s1")
	write(t, c, "d")
	testwait.WaitFor(t, 10*time.Second, "d delivered", func() bool { return len(tb.app.all()) == 5 })
	if ev := tb.app.all()[4]; string(ev.Payload) != "d" || ev.Seq != 4 || ev.Redelivery {
		t.Errorf("after a clean stop: %+v", ev)
	}
}

func TestAutoResponseAnsweredWithoutAnEvent(t *testing.T) {
	tb := newTestBox(t, Limits{}, true)
	tb.open = Reply{AutoRequest: "ping", AutoResponse: "pong", Messages: []Message{{Payload: []byte("welcome")}}}
	c := tb.dial(t, nil)
	if _, got := readMsg(t, c); got != "welcome" {
		t.Fatalf("open message %q", got)
	}
	testwait.WaitFor(t, 10*time.Second, "parked", func() bool { return tb.hub.Stats().Parked == 1 })
	write(t, c, "ping")
	if _, got := readMsg(t, c); got != "pong" {
		t.Fatalf("auto-response %q", got)
	}
	if evs := tb.app.all(); len(evs) != 0 {
		t.Errorf("the auto-request reached the instance: %+v", evs)
	}
}

func TestOversizeMessageIs1009(t *testing.T) {
	tb := newTestBox(t, Limits{MaxMessage: 1024}, false)
	c := tb.dial(t, nil)
	if err := c.Write(context.Background(), websocket.MessageBinary, make([]byte, 2000)); err != nil {
		t.Fatal(err)
	}
	if got := closeStatusOf(t, c); got != websocket.StatusMessageTooBig {
		t.Errorf("close %v, want 1009", got)
	}
	ev := tb.app.next(t)
	if ev.Kind != KindClose || ev.CloseCode != CloseTooBig || ev.Seq != 1 {
		t.Errorf("the instance got %+v, want a close event with 1009", ev)
	}
}

func TestFloodIs1013(t *testing.T) {
	tb := newTestBox(t, Limits{MaxPending: 8}, false)
	tb.app.gate = make(chan struct{}) // the instance takes nothing for now
	c := tb.dial(t, nil)
	for i := range 20 {
		if err := c.Write(context.Background(), websocket.MessageText, fmt.Appendf(nil, "m%d", i)); err != nil {
			break
		}
	}
	if got := closeStatusOf(t, c); got != websocket.StatusTryAgainLater {
		t.Errorf("close %v, want 1013", got)
	}
	close(tb.app.gate)
	testwait.WaitFor(t, 10*time.Second, "the close event", func() bool {
		evs := tb.app.all()
		return len(evs) > 0 && evs[len(evs)-1].Kind == KindClose
	})
	evs := tb.app.all()
	if len(evs) != 9 || evs[8].CloseCode != CloseTryAgainLater {
		t.Errorf("%d events, last %+v; want the 8 kept messages and a 1013 close", len(evs), evs[len(evs)-1])
	}
	if s := tb.hub.Stats(); s.Overflows != 1 {
		t.Errorf("overflows %d", s.Overflows)
	}
}

// TestSlowReaderIsCutWithBoundedMemory: a client that reads nothing is closed with 1008
// once what it has not read behind the write in progress would pass MaxOutBytes, so the
// box holds at most that write and MaxOutBytes (or one larger message) for it. The cut
// does not wait out WriteTimeout (a minute here, past the wait for the close event) for
// the write the client is not reading.
func TestSlowReaderIsCutWithBoundedMemory(t *testing.T) {
	const maxOut = 64 << 10
	for _, size := range []int{4096, 100 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			tb := newTestBox(t, Limits{MaxOutBytes: maxOut, WriteTimeout: time.Minute}, false)
			tb.dialRaw(t) // never reads
			id := tb.lastID()
			msg := Message{Payload: bytes.Repeat([]byte("x"), size)}
			var peak int64
			sent := 0
			for tb.hub.Send("s1", id, msg) == nil {
				sent++
				peak = max(peak, tb.hub.Stats().OutBytes)
				if sent > 100000 {
					t.Fatal("the box kept queueing for a client that does not read")
				}
			}
			if bound := int64(2 * max(maxOut, size+ws.MaxHeaderSize)); peak > bound {
				t.Errorf("queued %d bytes for one client, over %d", peak, bound)
			}
			if got := tb.hub.Stats().Closes[ClosePolicy]; got != 1 {
				t.Errorf("1008 closes %d, want 1", got)
			}
			ev := tb.app.next(t)
			if ev.Kind != KindClose || ev.CloseCode != ClosePolicy {
				t.Errorf("close event %+v", ev)
			}
		})
	}
}

// TestSlowReaderCutEndsTheWriteInProgress: a client cut as a slow reader while the box is
// stuck writing it a message it does not read (a message larger than the sockets' buffers)
// has its socket ended within a second, and the instance hears of the close then, not
// after WriteTimeout (a minute here, past the test's wait).
func TestSlowReaderCutEndsTheWriteInProgress(t *testing.T) {
	const maxOut = 64 << 10
	tb := newTestBox(t, Limits{MaxOutBytes: maxOut, WriteTimeout: time.Minute}, false)
	tb.dialRaw(t) // never reads
	id := tb.lastID()
	// Nothing queued: it is taken whatever its size, and its write blocks.
	if err := tb.hub.Send("s1", id, Message{Payload: make([]byte, 16<<20)}); err != nil {
		t.Fatal(err)
	}
	c := tb.hub.lookup("s1", id)
	testwait.WaitFor(t, 10*time.Second, "the writer took the large message", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.writing && c.queued == 0
	})
	small := Message{Payload: make([]byte, maxOut/2)}
	for i := 0; tb.hub.Send("s1", id, small) == nil; i++ {
		if i > 10 {
			t.Fatal("the box kept queueing behind a write the client does not read")
		}
	}
	ev := tb.app.next(t)
	if ev.Kind != KindClose || ev.CloseCode != ClosePolicy {
		t.Errorf("close event %+v, want 1008", ev)
	}
}

func TestMalformedFramesCloseOnlyTheirConnection(t *testing.T) {
	cases := []struct {
		name  string
		send  func(t *testing.T, rc *rawClient)
		close int
	}{
		{"unmasked", func(t *testing.T, rc *rawClient) { rc.write(t, ws.OpText, true, []byte("hi"), true) }, CloseProtocolError},
		{"reserved opcode", func(t *testing.T, rc *rawClient) { rc.write(t, ws.OpCode(0x3), true, []byte("hi"), false) }, CloseProtocolError},
		{"continuation first", func(t *testing.T, rc *rawClient) { rc.write(t, ws.OpContinuation, true, []byte("hi"), false) }, CloseProtocolError},
		{"fragmented ping", func(t *testing.T, rc *rawClient) { rc.write(t, ws.OpPing, false, []byte("hi"), false) }, CloseProtocolError},
		{"text not utf-8", func(t *testing.T, rc *rawClient) { rc.write(t, ws.OpText, true, []byte{0xff, 0xfe}, false) }, CloseInvalidData},
		{"close of one byte", func(t *testing.T, rc *rawClient) { rc.write(t, ws.OpClose, true, []byte{3}, false) }, CloseProtocolError},
		{"reserved bits", func(t *testing.T, rc *rawClient) {
			rc.nc.Write([]byte{0x80 | 0x40 | 0x1, 0x80, 0, 0, 0, 0})
		}, CloseProtocolError},
	}
	tb := newTestBox(t, Limits{}, false)
	tb.app.reply = func(ev Event) Reply { return Reply{Messages: []Message{{Payload: ev.Payload}}} }
	good := tb.dial(t, nil)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := tb.dialRaw(t)
			tc.send(t, rc)
			if got := rc.readClose(t); got != tc.close {
				t.Errorf("close %d, want %d", got, tc.close)
			}
			write(t, good, "still here")
			if _, got := readMsg(t, good); got != "still here" {
				t.Errorf("the other connection got %q", got)
			}
		})
	}
}

func TestControlOperationsAreScopedToTheSpace(t *testing.T) {
	tb := newTestBox(t, Limits{}, false)
	a := tb.dial(t, nil)
	aID := tb.lastID()
	tb.dial(t, map[string][]string{"X-Space": {"s2"}})
	bID := tb.lastID()
	tags := []string{"room:1"}
	if err := tb.hub.Set("s1", aID, Reply{SetTags: &tags}); err != nil {
		t.Fatal(err)
	}
	if err := tb.hub.Send("s1", bID, Message{Payload: []byte("x")}); err != ErrUnknownConn {
		t.Errorf("s1 sending to s2's connection: %v", err)
	}
	if err := tb.hub.CloseConn("s1", bID, 1000, ""); err != ErrUnknownConn {
		t.Errorf("s1 closing s2's connection: %v", err)
	}
	if l := tb.hub.List("s1", ""); len(l) != 1 || l[0].ID != aID {
		t.Errorf("s1 lists %+v", l)
	}
	if n := tb.hub.SendTag("s1", "room:1", Message{Payload: []byte("to the room")}); n != 1 {
		t.Errorf("sent to %d", n)
	}
	if _, got := readMsg(t, a); got != "to the room" {
		t.Errorf("got %q", got)
	}
	if n := tb.hub.SendTag("s2", "room:1", Message{Payload: []byte("x")}); n != 0 {
		t.Errorf("s2 reached %d connections of s1's tag", n)
	}
}

func TestDrainClosesWith1012(t *testing.T) {
	tb := newTestBox(t, Limits{}, true)
	c := tb.dial(t, nil)
	testwait.WaitFor(t, 10*time.Second, "parked", func() bool { return tb.hub.Stats().Parked == 1 })
	go tb.hub.Shutdown(context.Background(), CloseServiceRestart)
	if got := closeStatusOf(t, c); got != websocket.StatusServiceRestart {
		t.Errorf("close %v, want 1012", got)
	}
}

func TestConnStateTransitions(t *testing.T) {
	all := []connState{stateOpen, stateClosing, stateGone, stateDone}
	want := map[[2]connState]bool{
		{stateOpen, stateClosing}: true, {stateOpen, stateGone}: true,
		{stateClosing, stateGone}: true, {stateGone, stateDone}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if got := allowed(from, to); got != want[[2]connState{from, to}] {
				t.Errorf("%s -> %s allowed=%v", from, to, got)
			}
		}
	}
}

func TestNewIDIsUnguessableShape(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := NewID()
		if !validID(id) || seen[id] || strings.ContainsAny(id, "+/=") {
			t.Fatalf("id %q", id)
		}
		seen[id] = true
	}
	id := NewID()
	for _, bad := range []string{id[:21], id + "A", id[:10] + "\r\n" + id[12:], id[:20] + "\n\n", "!" + id[1:]} {
		if validID(bad) {
			t.Errorf("validID(%q) accepted", bad)
		}
	}
}

func TestCheckpointCoveredByStartTime(t *testing.T) {
	tb := newTestBox(t, Limits{}, false)
	c := tb.dial(t, nil)
	write(t, c, "a")
	testwait.WaitFor(t, 10*time.Second, "a acknowledged", func() bool { return tb.hub.Stats().Delivered == 1 })
	started := time.Now()
	write(t, c, "b")
	testwait.WaitFor(t, 10*time.Second, "b acknowledged", func() bool { return tb.hub.Stats().Delivered == 2 })
	tb.hub.CheckpointCovered("s1", started)
	tb.hub.InstanceGone("s1")
	testwait.WaitFor(t, 10*time.Second, "b redelivered", func() bool { return len(tb.app.all()) == 3 })
	if ev := tb.app.all()[2]; string(ev.Payload) != "b" || !ev.Redelivery || ev.Seq != 2 {
		t.Errorf("redelivered %+v, want b", ev)
	}
}

func TestTricklingLargeMessagesCannotFillTheBox(t *testing.T) {
	tb := newTestBox(t, Limits{MaxBoxPendingBytes: 64 << 10}, false)
	rc := tb.dialRaw(t)
	// A 512 KiB message (within MaxMessage), of which only 100 KiB ever arrives.
	h := ws.Header{Fin: true, OpCode: ws.OpBinary, Length: 512 << 10, Masked: true}
	if err := ws.WriteHeader(rc.nc, h); err != nil {
		t.Fatal(err)
	}
	rc.nc.Write(make([]byte, 100<<10))
	if got := rc.readClose(t); got != CloseTryAgainLater {
		t.Errorf("close %d, want 1013", got)
	}
	// What is left is the close event (its reason), kept like any event until a checkpoint.
	testwait.WaitFor(t, 10*time.Second, "the partial message's bytes released", func() bool { return tb.hub.Stats().PendingBytes < 1024 })
}

// TestPingsAnsweredWhileTheReaderDeliversSlowly: the reader delivers a message itself when
// no delivery runs (read.go); one the instance is slow to answer gets a new reader beside
// it, so the client's pings are answered meanwhile, and what the client sends then is
// delivered after it, in order.
func TestPingsAnsweredWhileTheReaderDeliversSlowly(t *testing.T) {
	tb := newTestBox(t, Limits{}, false)
	entered, release := make(chan struct{}), make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	tb.app.mu.Lock()
	tb.app.fail = func(ev Event) bool {
		if string(ev.Payload) == "slow" {
			close(entered)
			<-release
		}
		return false
	}
	tb.app.mu.Unlock()
	c := tb.dial(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.CloseRead(ctx) // the client reads (pongs) in the background
	if err := c.Write(ctx, websocket.MessageText, []byte("slow")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the instance never got the first message")
	}
	pingCtx, pingCancel := context.WithTimeout(ctx, 3*time.Second)
	defer pingCancel()
	if err := c.Ping(pingCtx); err != nil {
		t.Fatalf("ping while the instance held a delivery: %v", err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("after")); err != nil {
		t.Fatal(err)
	}
	close(release)
	var got []string
	testwait.WaitFor(t, 10*time.Second, "both messages delivered", func() bool {
		got = got[:0]
		for _, ev := range tb.app.all() {
			if ev.Kind == KindText {
				got = append(got, string(ev.Payload))
			}
		}
		return len(got) == 2
	})
	if got[0] != "slow" || got[1] != "after" {
		t.Errorf("delivered %q, want [slow after]", got)
	}
}

// TestClientCloseCodes: a client's close code that RFC 6455 (section 7.4, and IANA's
// registry) lets a peer send is echoed and reported to the instance; any other is a
// protocol error: the box closes with 1002 and the instance hears 1002.
func TestClientCloseCodes(t *testing.T) {
	tb := newTestBox(t, Limits{}, false)
	for _, tc := range []struct {
		code  int
		valid bool
	}{
		{0, false}, {999, false}, {1000, true}, {1001, true}, {1002, true}, {1003, true},
		{1004, false}, {1005, false}, {1006, false}, {1007, true}, {1008, true}, {1009, true},
		{1010, true}, {1011, true}, {1012, true}, {1013, true}, {1014, true}, {1015, false},
		{1016, false}, {2999, false}, {3000, true}, {4000, true}, {4999, true}, {5000, false},
		{65535, false},
	} {
		t.Run(fmt.Sprint(tc.code), func(t *testing.T) {
			rc := tb.dialRaw(t)
			rc.write(t, ws.OpClose, true, ws.NewCloseFrameBody(ws.StatusCode(tc.code), "bye"), false)
			want := tc.code
			if !tc.valid {
				want = CloseProtocolError
			}
			if got := rc.readClose(t); got != want {
				t.Errorf("the box closed with %d, want %d", got, want)
			}
			ev := tb.app.next(t)
			if ev.Kind != KindClose || ev.CloseCode != want {
				t.Errorf("the instance got %s with code %d, want a close with %d", ev.Kind, ev.CloseCode, want)
			}
		})
	}
}

// TestHandshakeOfAnotherVersionNamesVersion13: a handshake with a Sec-WebSocket-Version
// the box does not speak is refused with the version it does (RFC 6455 section 4.4), so
// the client can retry with it.
func TestHandshakeOfAnotherVersionNamesVersion13(t *testing.T) {
	tb := newTestBox(t, Limits{}, false)
	for _, version := range []string{"8", ""} {
		req, _ := http.NewRequest(http.MethodGet, tb.srv.URL, nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		if version != "" {
			req.Header.Set("Sec-WebSocket-Version", version)
		}
		resp, err := tb.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Sec-WebSocket-Version") != "13" {
			t.Errorf("version %q: %d with Sec-WebSocket-Version %q, want 400 naming 13", version, resp.StatusCode, resp.Header.Get("Sec-WebSocket-Version"))
		}
	}
}

// TestWaitGoneWaitsOnTheState: the shutdown's wait for a socket to end returns when its
// state moves to gone, and when its context ends, with no poll between (synctest: a wait
// that polled would not be durably blocked).
func TestWaitGoneWaitsOnTheState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &Conn{}
		c.room.L = &c.mu
		done := make(chan struct{})
		go func() { c.waitGone(context.Background()); close(done) }()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("waitGone returned while the socket is open")
		default:
		}
		c.mu.Lock()
		c.setStateLocked(stateGone)
		c.mu.Unlock()
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("waitGone still waits after the socket is gone")
		}

		c2 := &Conn{}
		c2.room.L = &c2.mu
		ctx, cancel := context.WithCancel(context.Background())
		done2 := make(chan struct{})
		go func() { c2.waitGone(ctx); close(done2) }()
		synctest.Wait()
		cancel()
		synctest.Wait()
		select {
		case <-done2:
		default:
			t.Fatal("waitGone still waits after its context ended")
		}
	})
}

// TestDurableAcknowledgementRetiresAtOnce: an acknowledgement whose commits are in the
// bucket already (Reply.Durable, a kind of durability bucket) drops its message at once:
// nothing waits for a checkpoint, and the instance's end redelivers nothing. One that is
// not is kept until a checkpoint covers it, and redelivered if none does.
func TestDurableAcknowledgementRetiresAtOnce(t *testing.T) {
	for _, durable := range []bool{true, false} {
		t.Run(fmt.Sprintf("durable=%v", durable), func(t *testing.T) {
			tb := newTestBox(t, Limits{}, false)
			tb.app.reply = func(Event) Reply { return Reply{Durable: durable} }
			c := tb.dial(t, nil)
			write(t, c, "a")
			testwait.WaitFor(t, 10*time.Second, "a acknowledged", func() bool { return tb.hub.Stats().Delivered == 1 })
			want := 1
			if durable {
				want = 0
			}
			testwait.WaitFor(t, 10*time.Second, "a's message kept or retired", func() bool {
				l := tb.hub.List("s1", "")
				return len(l) == 1 && l[0].Pending == want
			})
			tb.hub.InstanceGone("s1")
			write(t, c, "b")
			testwait.WaitFor(t, 10*time.Second, "b delivered", func() bool {
				for _, ev := range tb.app.all() {
					if string(ev.Payload) == "b" {
						return true
					}
				}
				return false
			})
			redelivered := 0
			for _, ev := range tb.app.all() {
				if ev.Redelivery {
					redelivered++
				}
			}
			if redelivered != want {
				t.Fatalf("%d redeliveries after the instance's end, want %d", redelivered, want)
			}
		})
	}
}
