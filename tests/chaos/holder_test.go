package chaos

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// A request forwarded to the box holding a space, which then dies without answering
// (stopped, then killed: the campaign's 502s at a SIGKILL), gets 503 with Retry-After,
// never 502: the space is unavailable until the holder's lease frees.
func TestForwardedHolderDiesIs503(t *testing.T) {
	c := newCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	c.waitAllLive()
	host := "dies." + meshDomain
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "demo"}, http.StatusCreated, nil)
	harness.WaitFor(t, 10*time.Second, "a to have the route", func() bool {
		rs, err := a.routes()
		return err == nil && rs[host] != ""
	})
	post := func(n *node, text string) (*http.Response, error) { return n.postMessage(host, text) }
	// Wake the space wherever placement puts it (b, say), then send through the other
	// box (a) until a forwards to b: a now knows b as the holder.
	var holder string
	harness.WaitFor(t, 30*time.Second, "the space to answer", func() bool {
		resp, err := post(a, "wake")
		if err != nil {
			return false
		}
		resp.Body.Close()
		holder = resp.Header.Get(instanceHeader)
		return resp.StatusCode == http.StatusCreated && holder != ""
	})
	if strings.Contains(holder, a.self) {
		a, b = b, a
	}
	harness.WaitFor(t, 10*time.Second, "a to forward to b", func() bool {
		resp, err := post(a, "via a")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusCreated && strings.Contains(resp.Header.Get(instanceHeader), b.self)
	})

	// b stops answering; a request reaches a, which forwards it to b (still live for
	// dead_after); then b dies.
	b.Pause() // every thread stopped: none still answers the request below
	type answer struct {
		code     int
		retry    string
		instance string
		err      error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := post(a, "lost")
		if err != nil {
			got <- answer{err: err}
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got <- answer{code: resp.StatusCode, retry: resp.Header.Get("Retry-After"), instance: resp.Header.Get(instanceHeader)}
	}()
	time.Sleep(500 * time.Millisecond)
	b.Kill()
	ans := <-got
	if ans.err != nil {
		t.Fatalf("POST via a while its holder died: %v", ans.err)
	}
	// Sent to b on a pooled connection, the write's answer is lost: 503. When a's forward
	// had to open a new connection, the TLS handshake to the stopped b never finished and
	// nothing was sent: a serves it once b's lease frees (201 from an instance on a).
	switch {
	case ans.code == http.StatusServiceUnavailable && ans.retry != "":
	case ans.code == http.StatusCreated && strings.Contains(ans.instance, a.self):
	default:
		t.Fatalf("POST via a while its holder died: %d (Retry-After %q, instance %q), want 503 with Retry-After, or 201 from a after the takeover", ans.code, ans.retry, ans.instance)
	}
}
