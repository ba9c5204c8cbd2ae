package meshe2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// standbyTrio starts three boxes, the first with its bucket link through a proxy when
// proxied, and wakes a room of a standby kind on the first (its holder) with writes posted
// through the others until the holder streams to one of them (standby); entry is the
// third. acked holds the writes answered 201.
func standbyTrio(t *testing.T, tag string, proxied bool) (c *cluster, holder, standby, entry *node, host string, acked []string) {
	t.Helper()
	c = newCluster(t)
	c.kind = logOnlyKind(map[string]any{"durability": "standby"})
	nodes := []*node{c.start(proxied), c.start(false), c.start(false)}
	harness.WaitFor(t, 15*time.Second, "three live members", func() bool { return len(status(t, nodes[0]).Mesh.Live) == 3 })
	holder = nodes[0]
	host = hostOwnedBy(t, tag, holder, nodes...)
	c.createSpace(nodes[1], host)
	harness.WaitFor(t, 5*time.Second, "the row on every box", func() bool {
		return hasRoute(nodes[1], host) && hasRoute(nodes[2], host) && hasRoute(holder, host)
	})
	harness.WaitFor(t, 10*time.Second, "the holder's stream to a standby", func() bool {
		text := fmt.Sprintf("m-%d", len(acked))
		c.post(nodes[1], host, text)
		acked = append(acked, text)
		s := standbyOf(t, holder, host)
		for i, n := range nodes[1:] {
			if n.self == s.Box && s.Streamed > 0 {
				standby, entry = n, nodes[2-i]
			}
		}
		return standby != nil
	})
	for i := range 10 {
		text := fmt.Sprintf("before-%d", i)
		c.post(entry, host, text)
		acked = append(acked, text)
	}
	return c, holder, standby, entry, host, acked
}

// TestStandbyLeavingIsReleasedByItsHolder: the standby of a room leaves the fleet cleanly
// (SIGTERM: its heartbeat deleted, its spool kept), and the holder is killed with -9 the
// moment it is gone. Before it left, the standby asked the holder to release it: the
// holder proved the stream in the bucket and marked its standby record given up, so the
// third box takes the room over as soon as the holder is dead, with every write answered
// 201, rather than wait a minute for a standby that may be restarting.
func TestStandbyLeavingIsReleasedByItsHolder(t *testing.T) {
	c, holder, standby, entry, host, acked := standbyTrio(t, "released", false)
	if err := standby.Stop(); err != nil {
		t.Fatalf("stopping the standby: %v", err)
	}
	holder.Kill()
	if logs := standby.Logs(); !strings.Contains(logs, `"released":1`) {
		t.Errorf("the standby's log says nothing of its release:\n%s", harness.GrepLines(logs, "leaving"))
	}
	if logs := holder.Logs(); !strings.Contains(logs, "standby record marked given up") {
		t.Errorf("the holder's log does not show the record marked:\n%s", harness.GrepLines(logs, "standby"))
	}
	_, took := served(t, c, entry, host, acked, 20*time.Second)
	t.Logf("served by the last box %v after the holder's kill", took.Round(time.Millisecond))
}

// TestStandbyRestartingWhileItsHolderIsCutOff: the holder, its bucket link cut, answers
// writes 201 on its standby's word alone; then the standby restarts (SIGTERM, and back a
// few seconds later) and the holder is killed with -9 while it is down. The standby's
// release could not be granted (the holder cannot prove anything in the bucket), so the
// third box, finding the standby gone from the mesh and the record not marked, waits for
// it rather than wake the room from the bucket, which lacks those writes; once the standby
// is back the room is served with every write answered 201. (The 30-minute fault campaign
// on a5bce9b lost six writes so: a standby with no heartbeat was counted gone at once.)
func TestStandbyRestartingWhileItsHolderIsCutOff(t *testing.T) {
	c, holder, standby, entry, host, acked := standbyTrio(t, "restarting", true)
	holder.bucketProxy.SetDown(true)
	for i := range 5 {
		text := fmt.Sprintf("cut-%d", i)
		c.post(entry, host, text)
		acked = append(acked, text)
	}
	if err := standby.Stop(); err != nil {
		t.Fatalf("stopping the standby: %v", err)
	}
	holder.Kill()
	// The holder refuses (503: no bucket proof), or no longer holds the stream once it
	// fenced itself for its heartbeat's sake: either way it marked nothing.
	if logs := standby.Logs(); !strings.Contains(logs, `"released":0`) {
		t.Errorf("the standby's log does not show its release refused:\n%s", harness.GrepLines(logs, "leaving"))
	}
	// While the standby is down, the room is dark rather than served without its writes.
	deadline := time.Now().Add(deadAfter + 5*time.Second)
	for time.Now().Before(deadline) {
		if got, code, _ := c.roomTexts(entry, host); code == http.StatusOK {
			if lost := missing(acked, got); len(lost) > 0 {
				t.Fatalf("the room was served with its standby down, without %d acknowledged writes: %v", len(lost), lost)
			}
			t.Fatal("the room was served with its standby down and its holder dead")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(entry.Logs(), "waiting for the space's standby") {
		t.Errorf("the taker's log does not say it waits for the standby:\n%s", harness.GrepLines(entry.Logs(), "standby"))
	}
	standby.Start()
	_, took := served(t, c, entry, host, acked, 30*time.Second)
	t.Logf("served %v after the standby's restart", took.Round(time.Millisecond))
}
