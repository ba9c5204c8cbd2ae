package connhold

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestControlEndpoint(t *testing.T) {
	tb := newTestBox(t, Limits{}, false)
	a := tb.dial(t, nil)
	aID := tb.lastID()
	tb.dial(t, http.Header{"X-Space": {"s2"}})
	bID := tb.lastID()
	ctl := httptest.NewServer(tb.hub.ControlHandler("s1"))
	defer ctl.Close()
	do := func(method, path string, hdr http.Header, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, ctl.URL+path, strings.NewReader(body))
		for k, v := range hdr {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := do("POST", SendPath+"?conn="+aID, nil, "direct"); code != 204 {
		t.Fatalf("send: %d", code)
	}
	if _, got := readMsg(t, a); got != "direct" {
		t.Fatalf("got %q", got)
	}
	if code, _ := do("POST", SetPath+"?conn="+aID, http.Header{SetTagsHeader: {"room"}}, ""); code != 204 {
		t.Fatalf("set: %d", code)
	}
	if code, body := do("POST", SendPath+"?tag=room", http.Header{"Content-Type": {EventsContentType}},
		string(AppendEvent(AppendEvent(nil, Message{Payload: []byte("one")}), Message{Payload: []byte("two")}))); code != 200 || !strings.Contains(body, `"sent":1`) {
		t.Fatalf("send to tag: %d %s", code, body)
	}
	for _, want := range []string{"one", "two"} {
		if _, got := readMsg(t, a); got != want {
			t.Fatalf("got %q want %q", got, want)
		}
	}
	code, body := do("GET", ConnsPath, nil, "")
	if code != 200 || !strings.Contains(body, aID) || strings.Contains(body, bID) {
		t.Fatalf("list: %d %s", code, body)
	}
	// Another space's connection, through this space's endpoint: not found.
	for _, p := range []string{SendPath + "?conn=" + bID, SetPath + "?conn=" + bID, ClosePath + "?conn=" + bID} {
		if code, _ := do("POST", p, nil, "x"); code != 404 {
			t.Errorf("%s: %d, want 404", p, code)
		}
	}
	if code, _ := do("POST", ClosePath+"?conn="+aID+"&code=1006", nil, ""); code != 400 {
		t.Errorf("closing with 1006: %d, want 400", code)
	}
	if code, _ := do("POST", ClosePath+"?conn="+aID+"&code=4001&reason=done", nil, ""); code != 204 {
		t.Fatalf("close: %d", code)
	}
	if got := closeStatusOf(t, a); got != 4001 {
		t.Errorf("client saw close %d, want 4001", got)
	}
}
