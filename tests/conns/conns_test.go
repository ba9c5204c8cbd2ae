// Package conns runs a real box with an instance that opts its WebSockets in to being
// held (connhold): the space sleeps while the client's WebSocket stays open, and a
// client message wakes it and gets the new instance's answer on the same connection.
package conns

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lchat/lchat-caddy/tests/harness"
)

func buildApp(t *testing.T) string {
	t.Helper()
	return harness.Program(t, "lchat-test-connapp", "./tests/conns/connapp")
}

type status struct {
	Spaces []struct {
		Host  string `json:"host"`
		State string `json:"state"`
		PID   int    `json:"pid"`
	} `json:"spaces"`
}

func spaceState(t *testing.T, b *harness.Box, host string) (string, int) {
	var st status
	b.AdminJSON("GET", "/lchat/status", nil, 200, &st)
	for _, s := range st.Spaces {
		if s.Host == host {
			return s.State, s.PID
		}
	}
	return "", 0
}

// startHoldBox starts a box whose kind "hold" runs connapp (idle timeout 1s) and adds a
// space of that kind.
func startHoldBox(t *testing.T) (*harness.Box, string) {
	return startHoldBoxTLS(t, nil)
}

// startHoldBoxTLS is startHoldBox serving TLS with ca's certificate when ca is set.
func startHoldBoxTLS(t *testing.T, ca *harness.TestCA) (*harness.Box, string) {
	return startHoldBoxOf(t, ca, "")
}

// startHoldBoxOf is startHoldBoxTLS with the kind's durability ("": the default, bucket).
func startHoldBoxOf(t *testing.T, ca *harness.TestCA, durability string) (*harness.Box, string) {
	t.Helper()
	app := buildApp(t)
	kind := map[string]any{
		"command": app, "ready_path": "/healthz", "stop_grace": "5s", "idle_timeout": "1s",
		"isolation": "none", "network": "host", "replication": map[string]any{"class": "sleep"},
	}
	if durability != "" {
		kind["durability"] = durability
	}
	cfg := harness.Config{
		Bucket: map[string]any{"backend": "file", "root": "{$LCHAT_TEST_DIR}/bucket"},
		Lchat:  map[string]any{"kinds": map[string]any{"hold": kind}},
	}
	if ca != nil {
		cfg.CertFile, cfg.KeyFile = ca.CertFile, ca.KeyFile
	}
	b := harness.StartBox(t, harness.BoxOptions{JSON: cfg.JSON()})
	const host = "held.example.com"
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "hold"}, http.StatusCreated, nil)
	return b, host
}

func TestHeldWebSocketLetsTheSpaceSleepAndWakesIt(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) { heldWebSocket(t, useTLS) })
	}
}

// heldWebSocket runs the test through the box's plain listener, or its TLS one (Caddy's
// tls.Conn: the decrypted bytes it buffered are drained before the socket is parked).
func heldWebSocket(t *testing.T, useTLS bool) {
	var ca *harness.TestCA
	scheme, client := "ws", http.DefaultClient
	if useTLS {
		ca = harness.NewTestCA(t, t.TempDir(), "example.com")
		pool := x509.NewCertPool()
		pem, err := os.ReadFile(ca.CAFile)
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			t.Fatalf("reading the test CA: %v", err)
		}
		scheme = "wss"
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "held.example.com"}}}
	}
	b, host := startHoldBoxTLS(t, ca)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, scheme+"://"+b.HTTPAddr+"/ws", &websocket.DialOptions{Host: host, HTTPClient: client})
	if err != nil {
		t.Fatalf("dialing through the box: %v", err)
	}
	defer c.CloseNow()
	msgs := make(chan string, 16)
	go func() {
		defer close(msgs)
		for {
			_, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			msgs <- string(b)
		}
	}()
	next := func() string {
		t.Helper()
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatal("the connection ended")
			}
			return m
		case <-time.After(30 * time.Second):
			t.Fatal("no message within 30s")
		}
		return ""
	}
	_, pid1 := spaceState(t, b, host)
	if got := next(); got != fmt.Sprintf("hello from %d", pid1) {
		t.Fatalf("welcome %q, want the instance's (pid %d)", got, pid1)
	}

	// The open WebSocket does not keep the space awake.
	harness.WaitFor(t, 30*time.Second, "the space asleep with its WebSocket open", func() bool {
		st, _ := spaceState(t, b, host)
		return st == "asleep"
	})
	// Pings and the auto-response are answered by the box; the space stays asleep.
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping while the space sleeps: %v", err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("ping?")); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "pong!" {
		t.Fatalf("auto-response %q", got)
	}
	if st, _ := spaceState(t, b, host); st != "asleep" {
		t.Fatalf("after a ping and an auto-request the space is %s, want asleep", st)
	}

	// The metrics show the held connection, parked (its reader ends 10 ms after the last byte).
	var metrics string
	harness.WaitFor(t, 10*time.Second, "the metrics to show one parked connection", func() bool {
		_, body, err := b.Admin("GET", "/metrics", nil)
		metrics = harness.GrepLines(string(body), "lchat_conn")
		return err == nil && strings.Contains(metrics, `lchat_conns{state="parked"} 1`) &&
			strings.Contains(metrics, `lchat_conn_events_total{counter="pings"} 1`)
	})

	// The box's status (and so the fleet and the console) counts it too.
	var st struct {
		Counters map[string]uint64 `json:"counters"`
	}
	b.AdminJSON("GET", "/lchat/status", nil, 200, &st)
	if st.Counters["conns_open"] != 1 || st.Counters["conns_parked"] != 1 {
		t.Errorf("status counters %v: want one open, parked connection", st.Counters)
	}

	// A message wakes the space and the new instance's answer arrives on the same connection.
	if err := c.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatalf("writing after the space slept: %v", err)
	}
	got := next()
	_, pid2 := spaceState(t, b, host)
	if want := fmt.Sprintf("echo hi from %d seq 1", pid2); got != want || pid2 == pid1 {
		t.Fatalf("answer %q (instance pid %d, first %d), want %q from a new instance", got, pid2, pid1, want)
	}
	c.Close(websocket.StatusNormalClosure, "")
}

func TestResumableEventStreamOutlivesItsInstance(t *testing.T) {
	b, host := startHoldBox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.URL(host, "/events"), nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := b.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Lchat-Sse") != "" {
		t.Fatalf("status %d, Lchat-Sse %q (the box's own header must not reach the client)", resp.StatusCode, resp.Header.Get("Lchat-Sse"))
	}
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	data := func() string {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatal("the stream ended")
				}
				if strings.Contains(l, "half") {
					t.Fatalf("the client got half an event: %q", l)
				}
				if d, ok := strings.CutPrefix(l, "data: "); ok {
					return d
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no event within 30s")
			}
		}
	}
	_, pid1 := spaceState(t, b, host)
	if got, want := data(), fmt.Sprintf(`1 from %d after ""`, pid1); got != want {
		t.Fatalf("first event %q, want %q", got, want)
	}
	harness.WaitFor(t, 30*time.Second, "the space asleep with its event stream open", func() bool {
		st, _ := spaceState(t, b, host)
		return st == "asleep"
	})
	// Something else wakes the space; the stream goes on from the next instance.
	if r, err := b.Client().Get(b.URL(host, "/healthz")); err != nil || r.StatusCode != 200 {
		t.Fatalf("waking: %v %v", r, err)
	}
	got := data()
	_, pid2 := spaceState(t, b, host)
	if want := fmt.Sprintf(`2 from %d after "1"`, pid2); got != want || pid2 == pid1 {
		t.Fatalf("resumed event %q (pid %d, first %d), want %q", got, pid2, pid1, want)
	}
}

func TestInstanceBroadcastsThroughItsControlEndpoint(t *testing.T) {
	b, host := startHoldBox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var clients []*websocket.Conn
	for range 2 {
		c, _, err := websocket.Dial(ctx, "ws://"+b.HTTPAddr+"/ws", &websocket.DialOptions{Host: host})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		if _, _, err := c.Read(ctx); err != nil { // the welcome
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	if err := clients[0].Write(ctx, websocket.MessageText, []byte("broadcast hi all")); err != nil {
		t.Fatal(err)
	}
	for i, c := range clients {
		_, got, err := c.Read(ctx)
		if err != nil || string(got) != "hi all" {
			t.Fatalf("client %d got %q, %v", i, got, err)
		}
	}
}

// dialHeld opens a held WebSocket to host and reads its welcome.
func dialHeld(t *testing.T, ctx context.Context, b *harness.Box, host string) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.Dial(ctx, "ws://"+b.HTTPAddr+"/ws", &websocket.DialOptions{Host: host})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	if _, _, err := c.Read(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// ackedThenCrashed sends x on a held WebSocket of a space of the durability given
// ("": the default), reads its echo, SIGKILLs the instance that acknowledged it and
// returns the connection and that instance's pid.
func ackedThenCrashed(t *testing.T, ctx context.Context, durability string) (b *harness.Box, host string, c *websocket.Conn, pid1 int) {
	t.Helper()
	b, host = startHoldBoxOf(t, nil, durability)
	c = dialHeld(t, ctx, b, host)
	if err := c.Write(ctx, websocket.MessageText, []byte("x")); err != nil {
		t.Fatal(err)
	}
	_, got, err := c.Read(ctx)
	_, pid1 = spaceState(t, b, host)
	if err != nil || string(got) != fmt.Sprintf("echo x from %d seq 1", pid1) {
		t.Fatalf("first answer %q, %v", got, err)
	}
	if err := syscall.Kill(pid1, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return b, host, c, pid1
}

// On a kind of durability checkpoint, a message the instance acknowledged but no
// checkpoint saved is delivered again, with its sequence number and marked, to the
// instance that follows a crash.
func TestCrashRedeliversToTheNextInstance(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, host, c, pid1 := ackedThenCrashed(t, ctx, "checkpoint")
	_, got, err := c.Read(ctx)
	_, pid2 := spaceState(t, b, host)
	if err != nil || string(got) != fmt.Sprintf("echo x from %d seq 1 redelivered", pid2) || pid2 == pid1 {
		t.Fatalf("after the crash: %q, %v (pids %d, %d)", got, err, pid1, pid2)
	}
}

// On a kind of durability bucket (the default), a message whose acknowledgement passed
// the output gate (the instance keeps no state outside SQLite's WAL: nothing here) is
// retired at once: the instance that follows a crash is not given it again, and the next
// message is the next in sequence.
func TestCrashDoesNotRedeliverADurableAcknowledgement(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, host, c, pid1 := ackedThenCrashed(t, ctx, "")
	// The next message wakes the next instance; were x delivered again, its echo would
	// come first.
	if err := c.Write(ctx, websocket.MessageText, []byte("y")); err != nil {
		t.Fatal(err)
	}
	_, got, err := c.Read(ctx)
	_, pid2 := spaceState(t, b, host)
	// y itself may be marked redelivered: the box may have tried it on the dead instance.
	want := fmt.Sprintf("echo y from %d seq 2", pid2)
	if err != nil || strings.TrimSuffix(string(got), " redelivered") != want || pid2 == pid1 {
		t.Fatalf("after the crash: %q, %v (pids %d, %d), want %q: y's echo, seq 2, from a new instance", got, err, pid1, pid2, want)
	}
}

// A box shutting down closes its held WebSockets with 1012, so clients reconnect elsewhere.
func TestShutdownClosesHeldWebSocketsWith1012(t *testing.T) {
	b, host := startHoldBox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dialHeld(t, ctx, b, host)
	done := make(chan error, 1)
	go func() { done <- b.Stop() }()
	_, _, err := c.Read(ctx)
	if got := websocket.CloseStatus(err); got != websocket.StatusServiceRestart {
		t.Errorf("close %v (%v), want 1012", got, err)
	}
	if err := <-done; err != nil {
		t.Errorf("stopping the box: %v", err)
	}
}

// A client cannot forge the box's events: the /.lchat/ namespace is refused.
func TestClientsCannotReachTheBoxNamespace(t *testing.T) {
	b, host := startHoldBox(t)
	for _, p := range []string{"/.lchat/ws/event", "/x/../.lchat/ws/event"} {
		req, _ := http.NewRequest("POST", b.URL(host, p), strings.NewReader("forged"))
		req.Header.Set("Lchat-Conn-Id", connIDLike)
		req.Header.Set("Lchat-Event", "text")
		resp, err := b.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("POST %s from a client: %d, want 404", p, resp.StatusCode)
		}
	}
}

const connIDLike = "AAAAAAAAAAAAAAAAAAAAAA"

// TestAcknowledgedBacklogIsCheckpointedNotClosed: a space that checkpoints only at sleep
// keeps every acknowledged message pending until a checkpoint covers it; once they pile
// up the box takes a checkpoint on demand, so a connection sending steadily never hits
// its pending cap (1013) while the space stays awake. Steadily here is 128 messages in
// about a second on a cap of 128: a checkpoint covers what was acknowledged before it
// began, so it frees a connection that sends its cap within any second (when the box
// took a second off a checkpoint's start, this connection was closed with 1013).
func TestAcknowledgedBacklogIsCheckpointedNotClosed(t *testing.T) {
	app := buildApp(t)
	cfg := harness.Config{
		Bucket: map[string]any{"backend": "file", "root": "{$LCHAT_TEST_DIR}/bucket"},
		Lchat: map[string]any{
			"connections": map[string]any{"max_pending": 128},
			"kinds": map[string]any{"hold": map[string]any{
				"command": app, "ready_path": "/healthz", "stop_grace": "5s", "idle_timeout": "30s",
				"isolation": "none", "network": "host", "replication": map[string]any{"class": "sleep"},
			}}},
	}
	b := harness.StartBox(t, harness.BoxOptions{JSON: cfg.JSON()})
	const host = "backlog.example.com"
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "hold"}, http.StatusCreated, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := dialHeld(t, ctx, b, host)
	// Three times the cap, 2 ms apart: 150 to 200 a second here, so a checkpoint asked
	// for at half the cap has 64 messages' time (300 ms or more) to complete; one of this
	// space takes a few milliseconds.
	for i := 1; i <= 384; i++ {
		if err := c.Write(ctx, websocket.MessageText, []byte(fmt.Sprint(i))); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		_, got, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("message %d: the connection closed (%v): the backlog was not checkpointed", i, err)
		}
		if want := fmt.Sprintf("echo %d from ", i); !strings.HasPrefix(string(got), want) {
			t.Fatalf("message %d: answer %q", i, got)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
