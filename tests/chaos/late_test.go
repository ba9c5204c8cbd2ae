package chaos

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// A holder's checkpoint is held in flight on its bucket link (its manifest PUT caught by the
// link's proxy) while the holder pauses; the other box takes the space over and
// acknowledges writes; then the late manifest write reaches the bucket. No write the new
// holder acknowledged may be lost: the new holder fenced the manifest at its wake, so the
// late write fails its condition (issue 17, the campaign's losses after a SIGSTOP). On the
// code before the fence the late write landed, and the new holder's next checkpoint was the
// one fenced out, taking every write it had acknowledged with it.
func TestLateCheckpointAfterTakeoverLosesNothing(t *testing.T) {
	c := newCluster(t, 2)
	c.waitAllLive()
	host := "late." + meshDomain
	c.nodes[0].AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "demo"}, http.StatusCreated, nil)
	harness.WaitFor(t, 10*time.Second, "both boxes to have the route", func() bool {
		for _, n := range c.nodes {
			if rs, err := n.routes(); err != nil || rs[host] == "" {
				return false
			}
		}
		return true
	})
	// ack posts text through n and reports the box whose instance acknowledged it.
	ack := func(n *node, text string) (string, bool) {
		resp, err := n.postMessage(host, text)
		if err != nil {
			return "", false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.Header.Get(instanceHeader), resp.StatusCode == http.StatusCreated
	}
	var inst string
	harness.WaitFor(t, 30*time.Second, "the space to answer", func() bool {
		var ok bool
		inst, ok = ack(c.nodes[0], "wake")
		return ok && inst != ""
	})
	old, nu := c.nodes[0], c.nodes[1]
	if strings.Contains(inst, nu.self) {
		old, nu = nu, old
	}
	for i := range 5 {
		if _, ok := ack(old, fmt.Sprintf("before-%d", i)); !ok {
			t.Fatalf("post before-%d through the holder failed", i)
		}
	}
	// Two checkpoints end after the posts: the second began after them, so before-* are in
	// the bucket. The next checkpoint after one more post is caught on its way.
	posted := time.Now()
	var syncs []time.Time
	harness.WaitFor(t, 20*time.Second, "the holder to checkpoint twice after the posts", func() bool {
		if at := old.lastSync(host); at.After(posted) && (len(syncs) == 0 || at.After(syncs[len(syncs)-1])) {
			syncs = append(syncs, at)
		}
		return len(syncs) >= 2
	})
	key := []byte("/spaces/" + host + "/manifest")
	held := old.proxy.Hold(func(b []byte) bool { return bytes.HasPrefix(b, []byte("PUT ")) && bytes.Contains(b, key) })
	defer held.Release()
	if _, ok := ack(old, "in-the-late-checkpoint"); !ok {
		t.Fatal("post through the holder failed")
	}
	select {
	case <-held.Caught():
	case <-time.After(20 * time.Second):
		t.Fatal("the holder sent no manifest write in 20 s")
	}
	old.mu.Lock()
	old.stopped = true
	old.mu.Unlock()
	old.Pause()
	defer old.Resume()

	// The other box takes over once the paused one's heartbeat is older than dead_after.
	var acked []string
	harness.WaitFor(t, 60*time.Second, "the other box to serve the space", func() bool {
		inst, ok := ack(nu, "takeover")
		return ok && strings.Contains(inst, nu.self)
	})
	for i := range 10 {
		text := fmt.Sprintf("after-%d", i)
		inst, ok := ack(nu, text)
		if !ok || !strings.Contains(inst, nu.self) {
			t.Fatalf("post %s through the new holder: ok %v, instance %q", text, ok, inst)
		}
		acked = append(acked, text)
	}

	// The late write reaches the bucket; then the paused box resumes.
	held.Release()
	select {
	case <-held.Answered():
	case <-time.After(20 * time.Second):
		t.Fatal("the bucket did not answer the late manifest write in 20 s")
	}
	released := time.Now()
	syscall.Kill(old.PID(), syscall.SIGCONT)
	old.mu.Lock()
	old.stopped = false
	old.mu.Unlock()

	// The new holder's next checkpoint: it lands, or (before the fence) it is fenced out.
	for i := range 3 {
		text := fmt.Sprintf("late-%d", i)
		if _, ok := ack(nu, text); ok {
			acked = append(acked, text)
		}
	}
	harness.WaitFor(t, 30*time.Second, "the new holder to checkpoint after the late write, or to be fenced out", func() bool {
		var st boxStatus
		if nu.adminGet("/lchat/status", &st) != nil {
			return false
		}
		for _, sp := range st.Spaces {
			if sp.Host == host {
				return sp.State != "awake" || sp.LastSync != nil && sp.LastSync.After(released.Add(time.Second))
			}
		}
		return false
	})
	check := func(via *node, what string) {
		t.Helper()
		got, err := readAll(via, host)
		if err != nil {
			t.Fatalf("reading the messages through %s: %v", what, err)
		}
		var lost []string
		for _, m := range acked {
			if !got[m] {
				lost = append(lost, m)
			}
		}
		if len(lost) > 0 {
			t.Fatalf("through %s: %d of %d writes the new holder acknowledged are lost: %v", what, len(lost), len(acked), lost)
		}
		for i := range 5 {
			if m := fmt.Sprintf("before-%d", i); !got[m] {
				t.Fatalf("through %s: %s, acknowledged and checkpointed before the pause, is lost", what, m)
			}
		}
	}
	check(nu, "the new holder")
	// And they are in the bucket: the new holder drains, the resumed box wakes the space.
	if err := nu.Stop(); err != nil {
		t.Fatalf("stopping the new holder: %v", err)
	}
	check(old, "the resumed box, after the new holder drained")
	if strings.Contains(nu.Logs(), "manifest changed behind this box") {
		t.Error("the new holder was fenced out")
	}
}
