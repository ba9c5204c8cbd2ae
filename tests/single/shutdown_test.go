package single

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// openStreams opens what the demo page itself keeps open -- a server-sent-events stream
// and a WebSocket -- to host through addr, and returns channels closed when each ends.
func openStreams(t *testing.T, client *http.Client, addr, host string) (sseDone, wsDone chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/api/events", nil)
	req.Host = host
	resp, err := client.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /api/events: %v %v", resp, err)
	}
	sseDone = make(chan struct{})
	go func() {
		defer close(sseDone)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
		}
	}()
	ws, _, err := websocket.Dial(ctx, "ws://"+addr+"/api/ws", &websocket.DialOptions{Host: host})
	if err != nil {
		t.Fatalf("websocket: %v", err)
	}
	wsDone = make(chan struct{})
	go func() {
		defer close(wsDone)
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				return
			}
		}
	}()
	return sseDone, wsDone
}

func closedWithin(ch chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// shutdownBound is how long a box with drain_timeout 20s and instances stopping within
// their 5s stop grace may take to exit: the drain's bound plus a few seconds.
const (
	testDrainTimeout = 20 * time.Second
	shutdownBound    = testDrainTimeout + 5*time.Second
)

// TestShutdownWithOpenStreams: SIGTERM and `lchat-caddy stop` on a box whose space has an
// open SSE stream and WebSocket (a browser tab on the demo page). The drain starts at
// once, the streams end with the instance, the box exits within drain_timeout plus a few
// seconds -- with Caddy's default, eternal, grace period -- and a new box on the bucket
// serves every acknowledged write. Before, the http app waited for the streams forever
// and the drain never started.
func TestShutdownWithOpenStreams(t *testing.T) {
	e := newEnv(t)
	cfg := harness.Config{Lchat: map[string]any{
		"drain_timeout": testDrainTimeout.String(),
		"kinds": map[string]any{"demo": harness.DemoKind(map[string]any{
			"idle_timeout": "10m", "replication": map[string]any{"class": "periodic", "interval": "1h"},
		})},
	}}.JSON()
	start := func() *harness.Box {
		return harness.StartBox(t, harness.BoxOptions{JSON: cfg, Env: e.s3.Env(e.prefix)})
	}
	const host = "tab.example.com"
	var acked []string
	for _, how := range []string{"SIGTERM", "lchat-caddy stop"} {
		b := start() // a new box (its own registry) on the same bucket
		createSpace(t, b, host)
		for j := range 3 {
			msg := fmt.Sprintf("%s ack %d", how, j)
			postMessage(t, b, host, msg)
			acked = append(acked, msg)
		}
		sseDone, wsDone := openStreams(t, b.Client(), b.HTTPAddr, host)
		began := time.Now()
		switch how {
		case "SIGTERM":
			go b.Stop()
		default:
			if out, err := b.CLI("stop"); err != nil {
				t.Fatalf("lchat-caddy stop: %v %s", err, out)
			}
		}
		harness.WaitFor(t, 2*time.Minute, "the box to exit", b.Exited)
		took := time.Since(began)
		t.Logf("%s with an open SSE stream and WebSocket: exited in %v", how, took.Round(time.Millisecond))
		if took > shutdownBound {
			t.Errorf("%s took %v with open streams, want within %v (drain_timeout + 5s)", how, took, shutdownBound)
		}
		if !closedWithin(sseDone, 5*time.Second) || !closedWithin(wsDone, 5*time.Second) {
			t.Errorf("%s: the open streams did not end with the box", how)
		}
	}
	b := start()
	createSpace(t, b, host)
	got := messages(t, b, host)
	for _, m := range acked {
		if !strings.Contains(got, m) {
			t.Errorf("acknowledged write %q lost across the shutdowns", m)
		}
	}
}

// TestDevShutdownWithOpenStreams: Ctrl-C on `lchat-caddy dev` with the demo page's
// streams open exits in bound, and the next run has every acknowledged write.
func TestDevShutdownWithOpenStreams(t *testing.T) {
	dir, home := t.TempDir(), t.TempDir()
	d := startDev(t, dir, home)
	for j := range 3 {
		if code, body := d.do(t, "POST", "/api/messages", fmt.Sprintf(`{"author":"dev","text":"dev ack %d"}`, j)); code != http.StatusCreated {
			t.Fatalf("posting: %d %s", code, body)
		}
	}
	sseDone, wsDone := openStreams(t, http.DefaultClient, d.listen, "demo.localhost")
	began := time.Now()
	d.interrupt(t)
	took := time.Since(began)
	t.Logf("dev Ctrl-C with an open SSE stream and WebSocket: exited in %v", took.Round(time.Millisecond))
	// dev keeps the default drain_timeout (60s); the demo kind stops within 10s.
	if took > 30*time.Second {
		t.Errorf("dev took %v to exit with open streams, want within 30s", took)
	}
	if !closedWithin(sseDone, 5*time.Second) || !closedWithin(wsDone, 5*time.Second) {
		t.Error("the open streams did not end with dev")
	}
	d = startDev(t, dir, home)
	_, body := d.do(t, "GET", "/api/messages", "")
	for j := range 3 {
		if want := fmt.Sprintf("dev ack %d", j); !strings.Contains(body, want) {
			t.Errorf("acknowledged write %q lost across Ctrl-C", want)
		}
	}
	d.interrupt(t)
}
