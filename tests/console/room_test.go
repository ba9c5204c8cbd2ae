package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// instrumentConns runs in every document before its own scripts: it records what each
// EventSource and WebSocket the page (or the test) opens goes through, so the test can
// tell a connection held across a sleep from one the browser quietly reopened. An
// EventSource reconnects by itself after an error; its "error" event is the only trace.
const instrumentConns = `(() => {
  const log = [];
  window.__conns = log;
  function watch(kind, obj, url) {
    const rec = {kind, url: String(url), opens: 0, errors: 0, closes: [], messages: []};
    log.push(rec);
    obj.addEventListener('open', () => rec.opens++);
    obj.addEventListener('error', () => rec.errors++);
    obj.addEventListener('message', e => rec.messages.push(String(e.data)));
    if (kind === 'WebSocket') obj.addEventListener('close', e => rec.closes.push(e.code));
    rec.state = () => obj.readyState;
  }
  const ES = window.EventSource;
  window.EventSource = class extends ES {
    constructor(url, init) { super(url, init); watch('EventSource', this, url); }
  };
  const WS = window.WebSocket;
  window.WebSocket = class extends WS {
    constructor(url, protocols) { super(url, protocols); watch('WebSocket', this, url); }
  };
  window.__connsReport = () => JSON.stringify(log.map(r => ({
    kind: r.kind, url: r.url, opens: r.opens, errors: r.errors, closes: r.closes, messages: r.messages, state: r.state(),
  })));
})();`

// connRecord is one connection of a tab, as instrumentConns recorded it.
type connRecord struct {
	Kind     string   `json:"kind"`
	URL      string   `json:"url"`
	Opens    int      `json:"opens"`
	Errors   int      `json:"errors"`
	Closes   []int    `json:"closes"`
	Messages []string `json:"messages"`
	State    int      `json:"state"` // readyState: 1 is open for both
}

func onNewDocument(js string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: js})
		return chromedp.Void{}, err
	}
}

func (b *browser) conns() []connRecord {
	b.t.Helper()
	var out []connRecord
	if err := json.Unmarshal([]byte(eval[string](b, `window.__connsReport()`)), &out); err != nil {
		b.t.Fatalf("reading the tab's connections: %v", err)
	}
	return out
}

// devStatus is what the test reads of GET /lchat/status.
type devStatus struct {
	Spaces []struct {
		Host  string `json:"host"`
		State string `json:"state"`
	} `json:"spaces"`
	Counters map[string]uint64 `json:"counters"`
	Conns    map[string]struct {
		Open    int `json:"open"`
		Streams int `json:"streams"`
	} `json:"conns"`
}

func (d *dev) status(t *testing.T) devStatus {
	t.Helper()
	resp, err := http.Get("http://" + d.admin + "/lchat/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st devStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("decoding /lchat/status: %v", err)
	}
	return st
}

// stateOf is host's engine state on the box; "" when it never ran there.
func (st devStatus) stateOf(host string) string {
	for _, s := range st.Spaces {
		if s.Host == host {
			return s.State
		}
	}
	return ""
}

// TestRoomHeldAcrossASleepInTabs is what a user of the demo room relies on: the room open
// in three tabs of a real browser, each with the room's event stream and a WebSocket to
// it; the space sleeps while the box holds them all (counted as held connections in the
// status and the console); one tab posts, which wakes the room; every tab shows the
// message, on the connections it opened: no EventSource or WebSocket fired error or
// close, none reconnected.
func TestRoomHeldAcrossASleepInTabs(t *testing.T) {
	const tabs = 3
	d := startDev(t, 2*time.Second)
	const demo = "demo.localhost"
	roomURL := "http://" + demo + ":" + d.port + "/"
	root := harness.Browser(t)
	art := harness.ArtifactDir(t, "console")

	var bs []*browser
	for i := range tabs {
		ctx := root
		if i > 0 {
			var cancel context.CancelFunc
			ctx, cancel = chromedp.NewContext(root) // another tab of the same browser
			t.Cleanup(cancel)
			// Opened bound to ctx itself (as harness.Browser does), not to the shorter
			// context of the first action, which would close it.
			if err := chromedp.Do(ctx); err != nil {
				t.Fatalf("opening tab %d: %v", i, err)
			}
		}
		b := &browser{t: t, ctx: ctx, art: art, n: 10 * i}
		b.do(fmt.Sprintf("open the room in tab %d", i), onNewDocument(instrumentConns), chromedp.Navigate(roomURL))
		b.wait("the room's event stream open", `JSON.parse(window.__connsReport()).some(c => c.kind === 'EventSource' && c.state === 1)`, 20*time.Second)
		// The room's page streams over server-sent events; the test adds the room's
		// WebSocket (/api/ws) beside it, as a client of the room would, unless the page
		// opens one itself.
		eval[bool](b, `(() => {
			if (!JSON.parse(window.__connsReport()).some(c => c.kind === 'WebSocket')) {
				new WebSocket(location.origin.replace(/^http/, 'ws') + '/api/ws');
			}
			return true;
		})()`)
		b.wait("the room's WebSocket open", `JSON.parse(window.__connsReport()).some(c => c.kind === 'WebSocket' && c.state === 1)`, 20*time.Second)
		bs = append(bs, b)
		t.Cleanup(func() {
			if t.Failed() {
				ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
				defer cancel()
				report, err := chromedp.Run(ctx, chromedp.Evaluate[string](`window.__connsReport()`))
				t.Logf("tab %d's connections: %s %v", i, report, err)
			}
		})
	}

	// The space sleeps (its idle timeout) with every tab's connections held by the box,
	// counted beside each other in the box's status and in the console.
	var st devStatus
	harness.WaitFor(t, 30*time.Second, "the room asleep with 3 WebSockets and 3 event streams held", func() bool {
		st = d.status(t)
		c := st.Conns[demo]
		return st.stateOf(demo) == "asleep" && c.Open >= tabs && c.Streams == tabs &&
			st.Counters["conns_streams"] == tabs && st.Counters["conns_open"] == uint64(c.Open)
	}, func() string { return fmt.Sprintf("status: %+v", st) })
	wakes := st.Counters["wakes"]
	code, spacePage := d.get(t, "console.localhost", "/space/"+demo)
	if held := regexp.MustCompile(`<dd class="conns">([^<]*)</dd>`).FindStringSubmatch(spacePage); code != 200 || held == nil ||
		!regexp.MustCompile(`^\d+ WebSockets( \(\d+ parked\))?, 3 event streams$`).MatchString(held[1]) {
		t.Fatalf("the console's page of the room: %d, held connections %q; want its WebSockets and 3 event streams", code, held)
	}
	bs[0].shot("asleep-held")

	// One tab posts through the room's form; the post wakes the room.
	text := fmt.Sprintf("held across a sleep %d", time.Now().UnixNano())
	eval[bool](bs[0], fmt.Sprintf(`(() => {
		const f = document.querySelector('form#post');
		f.querySelector('[name=text]').value = %q;
		f.requestSubmit();
		return true;
	})()`, text))
	for i, b := range bs {
		b.wait(fmt.Sprintf("tab %d shows the message", i), fmt.Sprintf(`[...document.querySelectorAll('#messages li')].some(li => li.textContent.includes(%q))`, text), 30*time.Second)
		b.wait(fmt.Sprintf("tab %d's connections got the message", i), fmt.Sprintf(`(() => {
			const cs = JSON.parse(window.__connsReport());
			return cs.length > 0 && cs.every(c => c.messages.some(m => m.includes(%q)));
		})()`, text), 30*time.Second)
		b.shot(fmt.Sprintf("tab-%d-message", i))
	}
	if st := d.status(t); st.Counters["wakes"] <= wakes {
		t.Errorf("wakes %d after the post, %d before: the post did not wake the room", st.Counters["wakes"], wakes)
	}

	// No reconnect: every connection opened once and is open still, and none fired
	// error or close.
	for i, b := range bs {
		cs := b.conns()
		var kinds []string
		for _, c := range cs {
			kinds = append(kinds, c.Kind)
			if c.Opens != 1 || c.Errors != 0 || len(c.Closes) != 0 || c.State != 1 {
				t.Errorf("tab %d: %s %s opened %d times, %d errors, closes %v, readyState %d; want held: opened once, open, no error or close",
					i, c.Kind, c.URL, c.Opens, c.Errors, c.Closes, c.State)
			}
		}
		if j := strings.Join(kinds, ","); !strings.Contains(j, "EventSource") || !strings.Contains(j, "WebSocket") {
			t.Errorf("tab %d's connections: %s; want the room's EventSource and WebSocket", i, j)
		}
	}
}
