package meshe2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// Held connections across boxes (docs/connections.md, "Across boxes"): the box a client
// reached holds its WebSocket; the space runs on another box; that box is killed; the
// space wakes on a survivor and the client's socket, never closed, keeps working.

// heldClient is one client's WebSocket, read by a goroutine into a channel.
type heldClient struct {
	ws   *websocket.Conn
	msgs chan string
	done chan error
}

func dialHeld(t *testing.T, c *cluster, entry *node, host, path string) *heldClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, "wss://"+host+path, &websocket.DialOptions{HTTPClient: c.client(entry)})
	if err != nil {
		t.Fatalf("WebSocket to %s via %s: %v (%v)", host, entry.self, err, resp)
	}
	ws.SetReadLimit(1 << 20)
	hc := &heldClient{ws: ws, msgs: make(chan string, 256), done: make(chan error, 1)}
	go func() {
		for {
			_, b, err := ws.Read(context.Background())
			if err != nil {
				hc.done <- err
				return
			}
			hc.msgs <- string(b)
		}
	}()
	t.Cleanup(func() { ws.CloseNow() })
	return hc
}

// next is the client's next message; the test fails if the socket closed or nothing came.
func (hc *heldClient) next(t *testing.T, timeout time.Duration, what string) string {
	t.Helper()
	select {
	case m := <-hc.msgs:
		return m
	case err := <-hc.done:
		t.Fatalf("waiting for %s: the WebSocket ended: %v", what, err)
	case <-time.After(timeout):
		t.Fatalf("waiting for %s: nothing in %v", what, timeout)
	}
	return ""
}

// until reads messages until one contains want, and returns those read before it.
func (hc *heldClient) until(t *testing.T, timeout time.Duration, want string) []string {
	t.Helper()
	var before []string
	deadline := time.Now().Add(timeout)
	for {
		m := hc.next(t, time.Until(deadline), fmt.Sprintf("a message with %q (had %q)", want, before))
		if strings.Contains(m, want) {
			return before
		}
		before = append(before, m)
	}
}

func (hc *heldClient) send(t *testing.T, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hc.ws.Write(ctx, websocket.MessageText, []byte(text)); err != nil {
		t.Fatalf("sending %q: %v", text, err)
	}
}

func counter(t *testing.T, n *node, name string) uint64 {
	t.Helper()
	var st struct {
		Counters map[string]uint64 `json:"counters"`
	}
	n.AdminJSON("GET", "/lchat/status", nil, 200, &st)
	return st.Counters[name]
}

// TestHeldRoomAcrossBoxes is the chat room of the demo with held connections on three
// boxes: tabs on two boxes, the room awake on the third. A post reaches every tab (the
// instance's tag send goes through the peer API to the boxes holding them); the room's
// box is killed; the next post wakes the room on a survivor and reaches the same tabs on
// the same sockets.
func TestHeldRoomAcrossBoxes(t *testing.T) {
	c := newCluster(t)
	c.kind = map[string]any{"env": map[string]string{"DEMO_HOLD_CONNECTIONS": "1"}}
	a, b, cc := c.start(false), c.start(false), c.start(false)
	harness.WaitFor(t, 15*time.Second, "three live members", func() bool { return len(status(t, a).Mesh.Live) == 3 })
	host := hostOwnedBy(t, "room", b, a, b, cc)
	// The tab on c joins the room before b's view may list c: b reaches it all the same
	// (it knows which boxes hold its instance's connections).
	c.createSpace(a, host)
	harness.WaitFor(t, 5*time.Second, "the row on every box", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })
	c.post(b, host, "before any tab")
	if got := awakeOn(t, host, a, b, cc); len(got) != 1 || got[0] != b.self {
		t.Fatalf("%s awake on %v, want %s", host, got, b.self)
	}

	tabA := dialHeld(t, c, a, host, "/api/ws?after=0")
	tabC := dialHeld(t, c, cc, host, "/api/ws?after=0")
	for name, tab := range map[string]*heldClient{"tab on a": tabA, "tab on c": tabC} {
		if m := tab.next(t, 10*time.Second, name+"'s backlog"); !strings.Contains(m, "before any tab") {
			t.Fatalf("%s: first message %q, want the backlog", name, m)
		}
	}
	if got := counter(t, a, "conns_open") + counter(t, cc, "conns_open"); got != 2 {
		t.Fatalf("the entry boxes hold %d connections, want 2", got)
	}
	if got := counter(t, b, "conns_open"); got != 0 {
		t.Fatalf("the room's box holds %d connections, want 0: the entry boxes hold them", got)
	}

	c.post(a, host, "while the room is on b")
	for name, tab := range map[string]*heldClient{"tab on a": tabA, "tab on c": tabC} {
		tab.until(t, 10*time.Second, "while the room is on b")
		_ = name
	}

	waitSynced(t, b, host, time.Now())
	b.Kill()
	var code int
	harness.WaitFor(t, deadAfter+30*time.Second, "a post after the kill", func() bool {
		code, _, _ = c.do(a, "POST", host, "/api/messages", `{"author":"test","text":"after the kill"}`, nil)
		return code == 201
	}, func() string { return fmt.Sprintf("last status %d", code) })
	for name, tab := range map[string]*heldClient{"tab on a": tabA, "tab on c": tabC} {
		if skipped := tab.until(t, 20*time.Second, "after the kill"); len(skipped) > 0 {
			t.Errorf("%s got %q before the post after the kill", name, skipped)
		}
	}
	survivors := awakeOn(t, host, a, cc)
	if len(survivors) != 1 {
		t.Fatalf("after the kill %s awake on %v, want one survivor", host, survivors)
	}
	t.Logf("room moved from %s to %s; both tabs kept their sockets", b.self, survivors[0])
}

// hostMoving finds a fresh host owned by b among a, b and c, and by c once b is gone: a
// space that leaves the client's box (a) twice as boxes go.
func hostMoving(t *testing.T, tag string, a, b, c *node) string {
	t.Helper()
	for i := 0; i < 10000; i++ {
		h := fmt.Sprintf("%s%d.%s", tag, i, meshDomain)
		o3, _ := mesh.Owner(h, members(a, b, c), "")
		o2, _ := mesh.Owner(h, members(a, c), "")
		if o3.Self == b.self && o2.Self == c.self {
			return h
		}
	}
	t.Fatalf("no host owned by %s, then by %s", b.self, c.self)
	return ""
}

// connAppKind is the demo kind running tests/conns/connapp (under the box's uid, so the
// test can call a space's control endpoint as its instance does), with extra fields.
func connAppKind(t *testing.T, extra map[string]any) map[string]any {
	k := map[string]any{"command": buildConnApp(t), "args": []string{}, "ready_path": "/healthz",
		"isolation": "none", "network": "host", "replication": map[string]any{"class": "sleep"}}
	for key, v := range extra {
		k[key] = v
	}
	return k
}

// buildConnApp builds tests/conns/connapp, the smallest instance that holds its
// WebSockets and echoes each event with its sequence number.
func buildConnApp(t *testing.T) string {
	t.Helper()
	return harness.Program(t, "lchat-test-connapp", "./tests/conns/connapp")
}

// TestHeldEventsFollowTheSpace: a client holds a WebSocket at one box, its messages go
// to the instance on another; that box is killed before any checkpoint holds what its
// instance acknowledged; the survivor's instance gets the acknowledged message again,
// marked as a redelivery with its sequence number, before the next one, on the same
// socket. A kind of durability checkpoint: under bucket an acknowledgement that passed
// the gate is retired at once (TestCrashDoesNotRedeliverADurableAcknowledgement).
func TestHeldEventsFollowTheSpace(t *testing.T) {
	c := newCluster(t)
	c.kind = connAppKind(t, map[string]any{"idle_timeout": "5s", "durability": "checkpoint"})
	a, b, cc := c.start(false), c.start(false), c.start(false)
	harness.WaitFor(t, 15*time.Second, "three live members", func() bool { return len(status(t, a).Mesh.Live) == 3 })
	// Owned by b; once b is gone, by cc: the space moves away from the client's box twice.
	host := hostMoving(t, "echo", a, b, cc)
	c.createSpace(a, host)
	harness.WaitFor(t, 5*time.Second, "the row on every box", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })

	cl := dialHeld(t, c, a, host, "/ws")
	hello := cl.next(t, 20*time.Second, "the welcome")
	if got := awakeOn(t, host, a, b, cc); len(got) != 1 || got[0] != b.self {
		t.Fatalf("%s awake on %v, want its owner %s", host, got, b.self)
	}
	cl.send(t, "one")
	first := cl.next(t, 10*time.Second, "the echo of one")
	pidB := strings.TrimPrefix(hello, "hello from ")
	if want := "echo one from " + pidB + " seq 1"; first != want {
		t.Fatalf("echo %q, want %q", first, want)
	}
	cl.send(t, "ping?")
	if m := cl.next(t, 5*time.Second, "the auto-response"); m != "pong!" {
		t.Fatalf("auto-response %q, want pong!", m)
	}
	cl.send(t, "broadcast to all")
	if m := cl.next(t, 10*time.Second, "the broadcast"); m != "to all" {
		t.Fatalf("broadcast %q, want %q", m, "to all")
	}
	controlCallsReachOtherBoxes(t, b, host, cl)

	b.Kill()
	cl.send(t, "two")
	got := []string{cl.next(t, deadAfter+40*time.Second, "the redelivery of one"), cl.next(t, 10*time.Second, "the echo of two")}
	var pid string
	if _, err := fmt.Sscanf(got[0], "echo one from %s seq 1 redelivered", &pid); err != nil || pid == pidB {
		t.Fatalf("after the kill, first %q: want one again, redelivered, from a new instance", got[0])
	}
	// "broadcast to all" (seq 2) was acknowledged at b too: it is delivered again, and
	// its answer is the broadcast again.
	rest := got[1:]
	if got[1] == "to all" {
		rest = []string{cl.next(t, 10*time.Second, "the echo of two")}
	}
	// two may come marked as a redelivery: a try on a pooled connection to the dead box
	// can fail after it was written, and the holding box cannot know it was not seen.
	if want := "echo two from " + pid + " seq 3"; strings.TrimSuffix(rest[0], " redelivered") != want {
		t.Fatalf("after the kill, then %q, want %q", rest[0], want)
	}
	t.Logf("after the kill of %s the client got %q then %q on the same socket", b.self, got, rest)
	if n := counter(t, a, "conn_events_replayed"); n == 0 {
		t.Errorf("the entry box counts no replayed events")
	}
	if code, _, err := c.do(a, "GET", host, "/.lchat/ws/conns", "", nil); err != nil || code != 404 {
		t.Errorf("a client's GET of the box's namespace through the mesh: %d %v, want 404", code, err)
	}

	// The survivor that took the space over lets it sleep: the next message wakes it
	// on its owner, cc. Then cc drains: its last checkpoint holds every message; the
	// client's socket stays open and the next message reaches the instance on a. Whatever
	// comes before an answer is a redelivery of an earlier message, never a new one.
	harness.WaitFor(t, 30*time.Second, "the space asleep after its idle timeout", func() bool { return len(awakeOn(t, host, a, cc)) == 0 })
	for i, step := range []struct {
		text string
		seq  int
		on   *node
	}{{"three", 4, cc}, {"four", 5, a}} {
		if i == 1 {
			if err := cc.Stop(); err != nil {
				t.Fatalf("stopping %s: %v", cc.self, err)
			}
		}
		cl.send(t, step.text)
		before := cl.until(t, 30*time.Second, "echo "+step.text+" from ")
		for _, m := range before {
			if !strings.HasSuffix(m, " redelivered") && m != "to all" {
				t.Errorf("before %s's answer, %q: not a redelivery", step.text, m)
			}
		}
		up := []*node{a, cc}
		if i == 1 {
			up = []*node{a}
		}
		switch got := awakeOn(t, host, up...); {
		case len(got) != 1:
			t.Errorf("%s answered with %s awake on %v, want one box", step.text, host, got)
		case got[0] == step.on.self:
		case i == 0 && got[0] == a.self:
			// A forward to cc that failed to connect (a TLS handshake timing out on a
			// loaded machine) falls back to waking the space here: then the drain below
			// is not of the space's box.
			t.Logf("%s woke the space on %s, not its owner %s (a forward fell back)", step.text, a.self, cc.self)
		default:
			t.Errorf("%s answered by an instance on %v, want %s", step.text, got, step.on.self)
		}
		t.Logf("%s: %d redeliveries before its answer", step.text, len(before))
		if i == 1 && len(before) > 0 {
			// The drained box told the client's box, before it exited, that its last
			// checkpoint holds every message: nothing is delivered twice.
			t.Errorf("after a graceful drain, %q delivered again", before)
		}
	}

	// The client's own box drains: it closes the socket with 1012 (service restart), so
	// the client comes back through another box.
	if err := a.Stop(); err != nil {
		t.Fatalf("stopping %s: %v", a.self, err)
	}
	select {
	case err := <-cl.done:
		if websocket.CloseStatus(err) != websocket.StatusServiceRestart {
			t.Errorf("the entry box's drain ended the socket with %v, want 1012", err)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("the entry box stopped and the socket is still open")
	}
}

// TestHeldConnectionSurvivesARelocation: a client holds a WebSocket at a box in region
// us; its space runs on another us box, then sleeps; the operator relocates it to eu. The
// client's socket stays open and its next message is answered by the instance in eu, after
// nothing but redeliveries.
func TestHeldConnectionSurvivesARelocation(t *testing.T) {
	c := newCluster(t)
	c.kind = connAppKind(t, map[string]any{"idle_timeout": "3s"})
	c.env = []string{mesh.EnvRegion + "=us"}
	a, b := c.start(false), c.start(false)
	c.env = []string{mesh.EnvRegion + "=eu"}
	eu := c.start(false)
	harness.WaitFor(t, 15*time.Second, "three live members", func() bool { return len(status(t, a).Mesh.Live) == 3 })
	host := hostOwnedBy(t, "rel", b, a, b)
	a.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "demo", "home_region": "us"}, 201, nil)
	harness.WaitFor(t, 5*time.Second, "the row on every box", func() bool { return hasRoute(b, host) && hasRoute(eu, host) })

	cl := dialHeld(t, c, a, host, "/ws")
	hello := cl.next(t, 20*time.Second, "the welcome")
	cl.send(t, "one")
	if m, want := cl.next(t, 10*time.Second, "the echo of one"), "echo one from "+strings.TrimPrefix(hello, "hello from ")+" seq 1"; m != want {
		t.Fatalf("echo %q, want %q", m, want)
	}
	if got := awakeOn(t, host, a, b, eu); len(got) != 1 || got[0] != b.self {
		t.Fatalf("%s awake on %v, want %s", host, got, b.self)
	}
	// A space is relocated while it sleeps; its client's socket stays open meanwhile.
	harness.WaitFor(t, 20*time.Second, "the space asleep", func() bool { return len(awakeOn(t, host, a, b, eu)) == 0 })
	if out, err := a.CLI("relocate", host, "--to", "eu"); err != nil {
		t.Fatalf("relocate: %v\n%s", err, out)
	}
	harness.WaitFor(t, 10*time.Second, "every box sees the new home region", func() bool {
		for _, n := range []*node{a, b, eu} {
			var sum struct {
				HomeRegion string `json:"home_region"`
			}
			n.AdminJSON("GET", "/lchat/routes/"+host, nil, 200, &sum)
			if sum.HomeRegion != "eu" {
				return false
			}
		}
		return true
	})
	cl.send(t, "two")
	before := cl.until(t, 30*time.Second, "echo two from ")
	for _, m := range before {
		if !strings.HasSuffix(m, " redelivered") {
			t.Errorf("before two's answer, %q: not a redelivery", m)
		}
	}
	if got := awakeOn(t, host, a, b, eu); len(got) != 1 || got[0] != eu.self {
		t.Errorf("after the relocation two was answered with %s awake on %v, want %s", host, got, eu.self)
	}
	t.Logf("relocated with the socket held: %d redeliveries before two's answer", len(before))
}

// TestRemoteBacklogIsCheckpointedNotClosed: a space that checkpoints only at sleep runs on
// another box than its client's; the messages its instance acknowledged pile up at the
// client's box until a checkpoint there holds them. The client's box asks the space's box
// for a checkpoint (as it takes one itself for a local space), so a connection sending
// three times its pending cap is never closed with 1013.
func TestRemoteBacklogIsCheckpointedNotClosed(t *testing.T) {
	c := newCluster(t)
	c.kind = connAppKind(t, nil)
	c.lchat = map[string]any{"connections": map[string]any{"max_pending": 16}}
	a, b := c.start(false), c.start(false)
	harness.WaitFor(t, 15*time.Second, "two live members", func() bool { return len(status(t, a).Mesh.Live) == 2 })
	host := hostOwnedBy(t, "backlog", b, a, b)
	c.createSpace(a, host)
	harness.WaitFor(t, 5*time.Second, "the row on b", func() bool { return hasRoute(b, host) })
	cl := dialHeld(t, c, a, host, "/ws")
	cl.next(t, 20*time.Second, "the welcome")
	for i := 1; i <= 48; i++ {
		cl.send(t, fmt.Sprint(i))
		if m := cl.next(t, 10*time.Second, fmt.Sprintf("the echo of %d (a 1013 would end the socket)", i)); !strings.HasPrefix(m, fmt.Sprintf("echo %d from ", i)) {
			t.Fatalf("message %d: answer %q", i, m)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := awakeOn(t, host, a, b); len(got) != 1 || got[0] != b.self {
		t.Errorf("%s awake on %v, want %s (the test is about a space on another box)", host, got, b.self)
	}
}

// sseReader reads one server-sent event stream's lines into a channel.
func sseLines(t *testing.T, c *cluster, entry *node, host, path string) (<-chan string, <-chan error) {
	t.Helper()
	req, _ := http.NewRequest("GET", "https://"+host+path, nil)
	req.Header.Set("Accept", "text/event-stream")
	cl := c.client(entry)
	cl.Timeout = 0
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("event stream via %s: %v", entry.self, err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("event stream via %s: %d", entry.self, resp.StatusCode)
	}
	t.Cleanup(func() { resp.Body.Close() })
	lines, done := make(chan string, 256), make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		done <- fmt.Errorf("the stream ended: %v", sc.Err())
	}()
	return lines, done
}

// nextData is the next "data:" line of the stream.
func nextData(t *testing.T, lines <-chan string, done <-chan error, timeout time.Duration, what string) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-lines:
			if d, ok := strings.CutPrefix(l, "data: "); ok {
				return d
			}
		case err := <-done:
			t.Fatalf("waiting for %s: %v", what, err)
		case <-deadline:
			t.Fatalf("waiting for %s: nothing in %v", what, timeout)
		}
	}
}

// TestHeldEventStreamAcrossBoxes: a resumable event stream entered at one box, its space
// on another. The stream does not keep the space awake; the space's box is killed; when
// the space next wakes, on a survivor, because of another client's request, the same
// response goes on with the next event, reopened with Last-Event-ID. Then the space
// sleeps and wakes on yet another box: the stream goes on again.
func TestHeldEventStreamAcrossBoxes(t *testing.T) {
	c := newCluster(t)
	c.kind = connAppKind(t, map[string]any{"idle_timeout": "3s"})
	a, b, cc := c.start(false), c.start(false), c.start(false)
	harness.WaitFor(t, 15*time.Second, "three live members", func() bool { return len(status(t, a).Mesh.Live) == 3 })
	host := hostMoving(t, "sse", a, b, cc)
	c.createSpace(a, host)
	harness.WaitFor(t, 5*time.Second, "the row on every box", func() bool { return hasRoute(b, host) && hasRoute(cc, host) })

	lines, done := sseLines(t, c, a, host, "/events")
	first := nextData(t, lines, done, 20*time.Second, "the first event")
	if !strings.HasPrefix(first, "1 from ") || !strings.HasSuffix(first, `after ""`) {
		t.Fatalf("first event %q", first)
	}
	if got := awakeOn(t, host, a, b, cc); len(got) != 1 || got[0] != b.self {
		t.Fatalf("%s awake on %v, want %s", host, got, b.self)
	}
	b.Kill()
	// Another client wakes the space on a survivor (its owner now, cc, or the box that
	// takes the dead box's lease first).
	harness.WaitFor(t, deadAfter+30*time.Second, "a request after the kill", func() bool {
		code, _, _ := c.do(cc, "GET", host, "/healthz", "", nil)
		return code == 200
	})
	second := nextData(t, lines, done, 20*time.Second, "the event after the kill")
	if !strings.HasPrefix(second, "2 from ") || !strings.HasSuffix(second, `after "1"`) {
		t.Fatalf("after the kill, event %q: want 2, reopened after 1", second)
	}
	// The stream does not keep the space awake: it sleeps, then wakes on cc.
	harness.WaitFor(t, 30*time.Second, "the space asleep", func() bool { return len(awakeOn(t, host, a, cc)) == 0 })
	if code, _, err := c.do(a, "GET", host, "/healthz", "", nil); err != nil || code != 200 {
		t.Fatalf("waking the space: %d %v", code, err)
	}
	third := nextData(t, lines, done, 20*time.Second, "the event after a sleep")
	if !strings.HasPrefix(third, "3 from ") || !strings.HasSuffix(third, `after "2"`) {
		t.Fatalf("after a sleep, event %q: want 3, reopened after 2", third)
	}
	if got := awakeOn(t, host, a, cc); len(got) != 1 || got[0] != cc.self {
		t.Errorf("the third event came with %s awake on %v, want %s", host, got, cc.self)
	}
}

// controlCallsReachOtherBoxes makes the control calls an instance on n makes (as its
// instance would: the kind runs under the box's uid, as the test does) for a connection
// held at another box: the listing names it, a send to its id reaches it, an unknown id is
// 404 on every box.
func controlCallsReachOtherBoxes(t *testing.T, n *node, host string, cl *heldClient) {
	t.Helper()
	sock := engine.ControlSocketPath(filepath.Join(n.Dir, "state"), host)
	control := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}}
	resp, err := control.Get("http://box/.lchat/ws/conns")
	if err != nil {
		t.Fatalf("listing connections through %s's control endpoint: %v", n.self, err)
	}
	var list []struct {
		ID string `json:"id"`
	}
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list) != 1 {
		t.Fatalf("%s's control endpoint lists %d connections, want the one held at another box", n.self, len(list))
	}
	resp, err = control.Post("http://box/.lchat/ws/send?conn="+list[0].ID, "text/plain; charset=utf-8", strings.NewReader("to you"))
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("send to one connection held at another box: %v %v", resp, err)
	}
	resp.Body.Close()
	if m := cl.next(t, 10*time.Second, "the send to its id"); m != "to you" {
		t.Fatalf("send to its id: got %q", m)
	}
	resp, err = control.Post("http://box/.lchat/ws/send?conn=AAAAAAAAAAAAAAAAAAAAAA", "text/plain; charset=utf-8", strings.NewReader("x"))
	if err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("send to an id no box holds: %v %v, want 404", resp, err)
	}
	resp.Body.Close()
}
