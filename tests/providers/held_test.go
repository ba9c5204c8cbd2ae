package providers

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// connKind runs tests/conns/connapp, which holds its WebSockets and keeps a record of
// the messages it applied in its data directory (each once: it drops a redelivery at or
// below the highest Lchat-Seq it applied), checkpointed every second.
func connKind(t *testing.T) map[string]any {
	return map[string]any{"command": harness.Program(t, "lchat-test-connapp", "./tests/conns/connapp"), "args": []string{},
		"ready_path": "/healthz", "isolation": "none", "network": "host", "idle_timeout": "10m",
		"replication": map[string]any{"class": "periodic", "interval": "1s"}}
}

// heldClient is a WebSocket and the messages it reads.
type heldClient struct {
	ws   *websocket.Conn
	msgs chan string
	done chan error // the read error that ended the socket
}

func dialHeldVia(t *testing.T, ctx context.Context, f *fleet, n *node, host string) *heldClient {
	t.Helper()
	ws, _, err := websocket.Dial(ctx, "wss://"+host+"/ws", &websocket.DialOptions{HTTPClient: f.client(n)})
	if err != nil {
		t.Fatalf("WebSocket through %s to %s: %v", n.self, host, err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	c := &heldClient{ws: ws, msgs: make(chan string, 256), done: make(chan error, 1)}
	go func() {
		for {
			_, b, err := ws.Read(context.Background())
			if err != nil {
				c.done <- err
				close(c.msgs)
				return
			}
			c.msgs <- string(b)
		}
	}()
	return c
}

func (c *heldClient) send(t *testing.T, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, []byte(text)); err != nil {
		t.Fatalf("sending %q: %v", text, err)
	}
}

// collect reads until every message of want has come, returning the others.
func (c *heldClient) collect(t *testing.T, d time.Duration, want ...string) []string {
	t.Helper()
	var others []string
	left := map[string]bool{}
	for _, w := range want {
		left[w] = true
	}
	timeout := time.After(d)
	for len(left) > 0 {
		select {
		case m, ok := <-c.msgs:
			if !ok {
				t.Fatalf("the socket closed waiting for %q (%v); got %q", want, <-c.done, others)
			}
			if left[m] {
				delete(left, m)
				continue
			}
			others = append(others, m)
		case <-timeout:
			t.Fatalf("no %q within %s; got %q", want, d, others)
		}
	}
	return others
}

// ctlAnswer reads until the answer to a "ctl" message ("<status> <body>"); the messages
// before it may only be acknowledgements, broadcasts or the welcome.
func (c *heldClient) ctlAnswer(t *testing.T, d time.Duration) string {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case m, ok := <-c.msgs:
			if !ok {
				t.Fatalf("the socket closed waiting for a control call's answer: %v", <-c.done)
			}
			if m != "" && m[0] >= '0' && m[0] <= '9' {
				return m
			}
			if !strings.HasPrefix(m, "ack ") && !strings.HasPrefix(m, "dup ") && !strings.HasPrefix(m, "bcast ") && !strings.HasPrefix(m, "hello from ") {
				t.Errorf("unexpected %q before a control call's answer", m)
			}
		case <-timeout:
			t.Fatalf("no control call's answer within %s", d)
		}
	}
}

// conns is a box's held connections: WebSockets and streams open.
func conns(t *testing.T, n *node) uint64 {
	t.Helper()
	var st struct {
		Counters map[string]uint64 `json:"counters"`
	}
	n.AdminJSON(http.MethodGet, "/lchat/status", nil, http.StatusOK, &st)
	return st.Counters["conns_open"]
}

// TestHeldWebSocketOfADelegatedSpace: a WebSocket to a space delegated to fleet B is
// held by fleet A's entry box; its messages reach the instance on B over the provider
// hop, the instance's sends through its control endpoint reach it back; B's box is
// killed and started again while the client keeps sending, then the space is reclaimed
// by A while the socket stays open: the instance's record holds every message exactly
// once, and the client's socket is the one it opened.
func TestHeldWebSocketOfADelegatedSpace(t *testing.T) {
	ck := connKind(t)
	b := newFleet(t, "fleet-b", domainB, meshTokenB)
	a := newFleet(t, "fleet-a", domainA, meshTokenA)
	b.api = true
	b.lchat = map[string]any{"kinds": map[string]any{"demo": kind(), "conn": ck}, "provider_clients": []any{
		map[string]any{"name": "fleet-a", "token": tokenAToB, "sign_token": tokenBToA, "domains": []string{domainA}},
	}}
	bAddr := b.addr("127.0.0.3")
	a.lchat = map[string]any{"kinds": map[string]any{"demo": kind(), "conn": ck}, "providers": []any{map[string]any{
		"name": "partner", "url": "https://" + bAddr, "token": tokenAToB, "accept_token": tokenBToA,
		"domains": []string{domainA}, "trusted_ca_files": []string{b.ca.CAFile},
	}}}
	b1 := b.start(bAddr)
	a1 := a.start(a.addr("127.0.0.1"))
	const host = "held." + domainA
	a1.AdminJSON(http.MethodPost, "/lchat/routes", map[string]any{"host": host, "kind": "conn"}, http.StatusCreated, nil)
	if out, err := a1.CLI("delegate", host, "--to", "partner"); err != nil || !strings.Contains(out, "delegated "+host+" to partner") {
		t.Fatalf("delegate: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl := dialHeldVia(t, ctx, a, a1, host)
	select {
	case m := <-cl.msgs:
		if !strings.HasPrefix(m, "hello from ") {
			t.Fatalf("the welcome: %q", m)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no welcome")
	}
	if got := conns(t, a1); got != 1 {
		t.Errorf("A's entry box holds %d connections, want the client's", got)
	}
	if got := conns(t, b1); got != 0 {
		t.Errorf("B's box holds %d connections: the socket is not held at A", got)
	}
	cl.send(t, "ping?")
	cl.collect(t, 10*time.Second, "pong!")

	seq := 0
	apply := func(n int) {
		for range n {
			seq++
			cl.send(t, fmt.Sprintf("apply %d", seq))
		}
	}
	// Acknowledged; what else comes may only be an earlier answer, one to a redelivery
	// the instance dropped ("dup"), or a broadcast (the extra wanted ones).
	settle := func(what string, d time.Duration, extra ...string) {
		t.Helper()
		others := cl.collect(t, d, append(extra, fmt.Sprintf("ack %d", seq))...)
		t.Logf("%s: up to %d acknowledged, with %q", what, seq, others)
		for _, m := range others {
			if !strings.HasPrefix(m, "ack ") && !strings.HasPrefix(m, "dup ") && !strings.HasPrefix(m, "bcast ") && !strings.HasPrefix(m, "hello from ") {
				t.Errorf("%s: unexpected %q", what, m)
			}
		}
	}
	apply(5)
	settle("at the provider", 30*time.Second)
	// The instance's send to its tag, through its control endpoint on B, reaches the
	// socket A holds (the pull).
	seq++
	cl.send(t, fmt.Sprintf("bcast %d", seq))
	settle("a broadcast", 20*time.Second, fmt.Sprintf("bcast %d", seq))
	// The instance's control endpoint on B counts the socket A holds, as across the
	// boxes of one mesh: its listing has it, a tag send counts it, a send to an id no box
	// holds is 404.
	cl.send(t, "whoami")
	var id string
	for timeout := time.After(10 * time.Second); id == ""; {
		select {
		case m := <-cl.msgs:
			if v, ok := strings.CutPrefix(m, "id "); ok {
				id = v
			}
		case <-timeout:
			t.Fatal("no answer to whoami")
		}
	}
	cl.send(t, "ctl GET /.lchat/ws/conns")
	if got := cl.ctlAnswer(t, 10*time.Second); !strings.HasPrefix(got, "200 ") || !strings.Contains(got, `"id":"`+id+`"`) {
		t.Errorf("the instance's listing on B: %q, want A's socket %s", got, id)
	}
	cl.send(t, "ctl POST /.lchat/ws/send?tag=room") // its answer, and the send itself, in either order
	cl.collect(t, 20*time.Second, `200 {"sent":1}`, "from "+id)
	cl.send(t, "ctl POST /.lchat/ws/send?conn="+connhold.NewID())
	if got := cl.ctlAnswer(t, 10*time.Second); !strings.HasPrefix(got, "404 ") {
		t.Errorf("a send on B to a connection no box holds: %q, want 404", got)
	}

	// B's box killed with messages acknowledged since its last checkpoint, and started
	// again while the client sends: every message reaches the new instance, the ones its
	// state lost again; those its checkpoint holds are dropped if they come again.
	gen := generationIn(t, b, host)
	harness.WaitFor(t, 20*time.Second, "a checkpoint on B holding the first messages", func() bool { return generationIn(t, b, host) > gen })
	apply(3)
	settle("before the kill", 20*time.Second)
	b1.Kill()
	apply(3)
	b1.Start()
	settle("across the provider's restart", 90*time.Second)
	apply(2)
	settle("after the provider's restart", 30*time.Second)

	// Reclaimed while the socket stays open: the next messages reach A's own instance.
	if out, err := a1.CLI("reclaim", host); err != nil || !strings.Contains(out, "reclaimed "+host+" from partner") {
		t.Fatalf("reclaim: %v\n%s", err, out)
	}
	apply(2)
	settle("after the reclaim", 60*time.Second)
	seq++
	cl.send(t, fmt.Sprintf("bcast %d", seq))
	settle("a broadcast at home", 20*time.Second, fmt.Sprintf("bcast %d", seq))

	select {
	case err := <-cl.done:
		t.Fatalf("the client's socket closed: %v", err)
	default:
	}
	record := a.mustDo(a1, http.MethodGet, host, "/record", "", http.StatusOK)
	count := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(record), "\n") {
		f := strings.Fields(l)
		if len(f) == 4 {
			count[f[3]]++
		}
	}
	for i := 1; i <= seq; i++ {
		if n := count[fmt.Sprint(i)]; n != 1 {
			t.Errorf("message %d applied %d times", i, n)
		}
	}
	t.Logf("%d messages, each applied once, across a kill of the provider's box and a reclaim; A replayed %d", seq, counter(t, a1, "conn_events_replayed"))
}

func counter(t *testing.T, n *node, name string) uint64 {
	t.Helper()
	var st struct {
		Counters map[string]uint64 `json:"counters"`
	}
	n.AdminJSON(http.MethodGet, "/lchat/status", nil, http.StatusOK, &st)
	return st.Counters[name]
}
