package conns

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// envInt is the integer in the environment variable name, or def.
func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// kindConfig is the config of a box whose kind "hold" runs connapp with idle timeout idle
// and the connections block conns (nil: defaults).
func kindConfig(t *testing.T, idle string, conns map[string]any) harness.Config {
	t.Helper()
	app := buildApp(t)
	lchat := map[string]any{"kinds": map[string]any{"hold": map[string]any{
		"command": app, "ready_path": "/healthz", "stop_grace": "5s", "idle_timeout": idle,
		"isolation": "none", "network": "host", "replication": map[string]any{"class": "sleep"},
	}}}
	if conns != nil {
		lchat["connections"] = conns
	}
	return harness.Config{Bucket: map[string]any{"backend": "file", "root": "{$LCHAT_TEST_DIR}/bucket"}, Lchat: lchat}
}

// startKindBox starts a box of kindConfig and adds the spaces hosts of its kind.
func startKindBox(t *testing.T, idle string, conns map[string]any, hosts ...string) *harness.Box {
	t.Helper()
	return startBoxOf(t, kindConfig(t, idle, conns), hosts...)
}

// startBoxOf starts a box of cfg and adds the spaces hosts of its kind "hold".
func startBoxOf(t *testing.T, cfg harness.Config, hosts ...string) *harness.Box {
	t.Helper()
	b := harness.StartBox(t, harness.BoxOptions{JSON: cfg.JSON()})
	for _, h := range hosts {
		b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": h, "kind": "hold"}, http.StatusCreated, nil)
	}
	return b
}

func counters(t *testing.T, b *harness.Box) map[string]uint64 {
	var st struct {
		Counters map[string]uint64 `json:"counters"`
	}
	b.AdminJSON("GET", "/lchat/status", nil, 200, &st)
	return st.Counters
}

// soakClients is what the soak's WebSocket clients heard, by payload.
type soakClients struct {
	mu     sync.Mutex
	acks   map[string]int   // "ack" answers
	dups   map[string]int   // "dup" answers: redeliveries the instance dropped
	bcasts []map[string]int // per client, broadcasts received
	errs   []string         // a connection that ended, or a bad answer
}

func (s *soakClients) read(ctx context.Context, i int, c *websocket.Conn) {
	for {
		_, b, err := c.Read(ctx)
		s.mu.Lock()
		if err != nil {
			if ctx.Err() == nil {
				s.errs = append(s.errs, fmt.Sprintf("client %d: the connection ended: %v", i, err))
			}
			s.mu.Unlock()
			return
		}
		verb, arg, _ := strings.Cut(string(b), " ")
		switch verb {
		case "ack":
			s.acks[arg]++
		case "dup":
			s.dups[arg]++
		case "bcast":
			s.bcasts[i][arg]++
		case "hello":
		default:
			s.errs = append(s.errs, fmt.Sprintf("client %d: unexpected message %q", i, b))
		}
		s.mu.Unlock()
	}
}

// soakStream is one resumable event stream of the instance's record.
type soakStream struct {
	mu    sync.Mutex
	lines []string
	err   string
}

func (s *soakStream) read(ctx context.Context, body io.Reader) {
	sc := bufio.NewScanner(body)
	id := 0
	for sc.Scan() {
		l := sc.Text()
		s.mu.Lock()
		if v, ok := strings.CutPrefix(l, "id: "); ok {
			n, _ := strconv.Atoi(v)
			if n != len(s.lines)+1 && s.err == "" {
				s.err = fmt.Sprintf("event id %d after %d events: a gap or a repeat", n, len(s.lines))
			}
			id = n
		} else if d, ok := strings.CutPrefix(l, "data: "); ok && id == len(s.lines)+1 {
			s.lines = append(s.lines, d)
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	if ctx.Err() == nil && s.err == "" {
		s.err = fmt.Sprintf("the stream ended after %d events: %v", len(s.lines), sc.Err())
	}
	s.mu.Unlock()
}

// TestSleepWakeCyclesApplyEveryMessageOnce: many held WebSockets and resumable event
// streams stay open on one box while their space sleeps and wakes, cycle after cycle, and
// its instance is killed (kill -9) once mid-run. Every message a client sends is applied
// once by the instance (it drops redeliveries by Lchat-Seq; the test reads its stored
// record), every broadcast reaches every client, every stream gets the record in order
// without a gap, and no client reconnects. LCHAT_CONN_CYCLES sets the cycles (default 20;
// 1000 for the long form), LCHAT_CONN_CLIENTS the WebSockets (default 32).
func TestSleepWakeCyclesApplyEveryMessageOnce(t *testing.T) {
	cycles := envInt(t, "LCHAT_CONN_CYCLES", 20)
	nc := envInt(t, "LCHAT_CONN_CLIENTS", 32)
	const ns = 4
	const host = "soak.example.com"
	b := startKindBox(t, "300ms", nil, host)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	s := &soakClients{acks: map[string]int{}, dups: map[string]int{}}
	clients := make([]*websocket.Conn, nc)
	for i := range clients {
		c, _, err := websocket.Dial(ctx, "ws://"+b.HTTPAddr+"/ws", &websocket.DialOptions{Host: host})
		if err != nil {
			t.Fatalf("dialing client %d: %v", i, err)
		}
		defer c.CloseNow()
		clients[i] = c
		s.bcasts = append(s.bcasts, map[string]int{})
	}
	for i, c := range clients {
		go s.read(ctx, i, c)
	}
	streams := make([]*soakStream, ns)
	streamClient := b.Client()
	streamClient.Timeout = 0 // the streams last the whole run; ctx ends them
	for i := range streams {
		req, _ := http.NewRequestWithContext(ctx, "GET", b.URL(host, "/soak/events"), nil)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := streamClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("opening stream %d: %v %v", i, resp, err)
		}
		defer resp.Body.Close()
		streams[i] = &soakStream{}
		go streams[i].read(ctx, resp.Body)
	}
	clientErr := func() string {
		s.mu.Lock()
		defer s.mu.Unlock()
		return strings.Join(s.errs, "; ")
	}
	state := func() string { st, _ := spaceState(t, b, host); return st }
	start := time.Now()
	c0 := counters(t, b)
	var sent []string
	crashAt := cycles / 2 // and the cycles after it, until the kill made a crash
	for cycle := range cycles {
		harness.WaitFor(t, 30*time.Second, fmt.Sprintf("cycle %d: the space asleep", cycle),
			func() bool { return state() == "asleep" }, func() string { return "it is " + state() })
		if e := clientErr(); e != "" {
			t.Fatalf("cycle %d: %s", cycle, e)
		}
		// Every client sends one message; one of them a broadcast too. The first one
		// wakes the space; they all reach the new instance.
		var want []string
		bc := fmt.Sprintf("b%d", cycle)
		for i, c := range clients {
			p := fmt.Sprintf("c%d-%d", i, cycle)
			want = append(want, p)
			if err := c.Write(ctx, websocket.MessageText, []byte("apply "+p)); err != nil {
				t.Fatalf("cycle %d client %d: %v", cycle, i, err)
			}
			if i == cycle%nc {
				want = append(want, bc)
				if err := c.Write(ctx, websocket.MessageText, []byte("bcast "+bc)); err != nil {
					t.Fatalf("cycle %d client %d: %v", cycle, i, err)
				}
			}
		}
		sent = append(sent, want...)
		if cycle >= crashAt && counters(t, b)["crashes"] == c0["crashes"] {
			// Kill the instance while the cycle's messages are being applied. (Should the
			// kill meet an instance already stopping for its sleep, a stalled machine, it
			// is no crash: the next cycle tries again.)
			before := len(sent) - len(want) // every earlier message has its ack
			harness.WaitFor(t, 30*time.Second, "a first answer before the crash", func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return len(s.acks) > before
			})
			if _, pid := spaceState(t, b, host); pid != 0 {
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatalf("killing the instance: %v", err)
				}
			}
		}
		done := func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, p := range want {
				if s.acks[p]+s.dups[p] == 0 {
					return false
				}
			}
			for i := range clients {
				if s.bcasts[i][bc] == 0 {
					return false
				}
			}
			return len(s.errs) == 0
		}
		harness.WaitFor(t, 60*time.Second, fmt.Sprintf("cycle %d: every answer and broadcast", cycle), done, clientErr)
	}
	elapsed := time.Since(start)
	c1 := counters(t, b)

	// The instance's stored record: each message applied exactly once.
	resp, err := b.Client().Get(b.URL(host, "/record"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("reading the record: %v %v", resp, err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	applied := map[string]int{}
	for _, l := range lines {
		f := strings.SplitN(l, " ", 4) // conn seq verb payload
		if len(f) != 4 {
			t.Fatalf("record line %q", l)
		}
		applied[f[3]]++
	}
	lost, twice := 0, 0
	for _, p := range sent {
		switch n := applied[p]; {
		case n == 0:
			lost++
		case n > 1:
			twice++
		}
	}
	s.mu.Lock()
	dups, dupBcasts := 0, 0
	for _, n := range s.dups {
		dups += n
	}
	for i := range clients {
		for _, n := range s.bcasts[i] {
			dupBcasts += n - 1
		}
	}
	s.mu.Unlock()
	t.Logf("%d cycles, %d WebSockets, %d event streams in %v: %d messages sent, %d applied, lost %d, applied twice %d; "+
		"wakes %d, sleeps %d, crashes %d; events redelivered %d, of them dropped by the instance as applied %d; broadcasts received twice %d",
		cycles, nc, ns, elapsed.Round(time.Millisecond), len(sent), len(lines), lost, twice,
		c1["wakes"]-c0["wakes"], c1["sleeps"]-c0["sleeps"], c1["crashes"]-c0["crashes"],
		c1["conn_events_redelivered"]-c0["conn_events_redelivered"], dups, dupBcasts)
	if lost != 0 || twice != 0 || len(lines) != len(sent) {
		t.Errorf("%d messages sent, %d lines in the record: %d lost, %d applied twice", len(sent), len(lines), lost, twice)
	}
	if got := c1["wakes"] - c0["wakes"]; got < uint64(cycles) {
		t.Errorf("%d wakes over %d cycles: the space did not sleep between them", got, cycles)
	}
	if c1["crashes"]-c0["crashes"] != 1 {
		t.Errorf("%d crashes, want the one kill -9", c1["crashes"]-c0["crashes"])
	}

	// Every stream has the whole record, in order, on the response it opened.
	for i, st := range streams {
		harness.WaitFor(t, 30*time.Second, fmt.Sprintf("stream %d: every event", i), func() bool {
			st.mu.Lock()
			defer st.mu.Unlock()
			return len(st.lines) >= len(lines) || st.err != ""
		}, func() string {
			st.mu.Lock()
			defer st.mu.Unlock()
			return fmt.Sprintf("%d of %d events (%s)", len(st.lines), len(lines), st.err)
		})
		st.mu.Lock()
		if st.err != "" {
			t.Errorf("stream %d: %s", i, st.err)
		} else if strings.Join(st.lines[:len(lines)], "\n") != strings.Join(lines, "\n") {
			t.Errorf("stream %d: its events differ from the record", i)
		}
		st.mu.Unlock()
	}
	// No client reconnected: every socket is the one it opened, still held.
	if e := clientErr(); e != "" {
		t.Fatal(e)
	}
	if got := counters(t, b)["conns_open"]; got != uint64(nc) {
		t.Errorf("conns_open %d, want the %d clients' sockets", got, nc)
	}
}
