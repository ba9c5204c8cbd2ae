package meshe2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The helpers of the durability-bucket fault tests (durable_*_test.go): a kind that rides
// the log alone, the room's messages as a set, the gate's figures as the box reports them.

// logOnlyKind is the kind options of a space whose writes ride the log alone: durability
// bucket and no checkpoint while it is awake (replication sleep), so whatever a wake
// restores past the last sleep came from the log.
func logOnlyKind(extra map[string]any) map[string]any {
	k := map[string]any{"durability": "bucket", "replication": map[string]any{"class": "sleep"}}
	for key, v := range extra {
		k[key] = v
	}
	return k
}

// postText posts one demo-room message through n and returns the status and the
// response's header (0 and nil when no answer came).
func (c *cluster) postText(n *node, host, text string) (int, http.Header) {
	code, hdr, _, err := c.doH(n, "POST", host, "/api/messages", fmt.Sprintf(`{"author":"test","text":%q}`, text), nil)
	if err != nil {
		return 0, nil
	}
	return code, hdr
}

// roomTexts reads the demo room's messages through n: text -> id, and the status of the
// read (200 when the map is filled).
func (c *cluster) roomTexts(n *node, host string) (map[string]int64, int, error) {
	code, body, err := c.do(n, "GET", host, "/api/messages?limit=1000", "", nil)
	if err != nil || code != http.StatusOK {
		return nil, code, err
	}
	var msgs []struct {
		ID   int64  `json:"id"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal([]byte(body), &msgs); err != nil {
		return nil, code, fmt.Errorf("the room's messages: %v: %.200s", err, body)
	}
	out := make(map[string]int64, len(msgs))
	for _, m := range msgs {
		out[m.Text] = m.ID
	}
	return out, code, nil
}

// missing lists the texts of want that got are without.
func missing[V any](want []string, got map[string]V) []string {
	var out []string
	for _, w := range want {
		if _, ok := got[w]; !ok {
			out = append(out, w)
		}
	}
	return out
}

// gateOf is host's log and gate as n reports them (engine.DurableStatus); ok false when
// n reports none (the space is not awake there).
func gateOf(t *testing.T, n *node, host string) (g struct {
	Segments uint64 `json:"segments"`
	Waiting  int    `json:"waiting"`
	Failed   uint64 `json:"failed"`
}, ok bool) {
	t.Helper()
	// With a timeout: the status must answer whatever the bucket does.
	cl := &http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(n.AdminURL + "/lchat/status")
	if err != nil {
		t.Fatalf("%s's /lchat/status: %v", n.self, err)
	}
	defer resp.Body.Close()
	var st boxStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s's /lchat/status: %d %v", n.self, resp.StatusCode, err)
	}
	raw := st.logOf(host)
	if raw == "" || raw == "null" {
		return g, false
	}
	if err := json.Unmarshal([]byte(raw), &g); err != nil {
		t.Fatalf("%s's log status for %s: %v: %s", n.self, host, err, raw)
	}
	return g, true
}

// answeredBy is the box (its SELF) whose instance answered, from the instance header the
// boxes send with LCHAT_TEST_INSTANCE_HEADER=1 ("<self> <pid>@<wake>").
func answeredBy(hdr http.Header) string {
	self, _, _ := strings.Cut(hdr.Get("X-Lchat-Instance"), " ")
	return self
}
