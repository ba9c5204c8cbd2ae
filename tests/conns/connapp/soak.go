package main

import (
	"bufio"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// record is the instance's durable state for the soak tests: every client message it
// applied, one line each ("<conn> <seq> <payload>") in $LCHAT_DATA_DIR/record, written
// before the event is acknowledged. It drops a message whose Lchat-Seq is at or below the
// highest it applied on that connection, as docs/connections.md tells an app to. The file
// is created at the first append: an instance that applies nothing has no file a bucket
// kind's log does not carry (its acknowledgements are then durable at the gate).
type record struct {
	mu      sync.Mutex
	path    string
	f       *os.File
	lines   []string
	high    map[string]uint64
	changed chan struct{} // closed and replaced at every append
}

var rec = openRecord(filepath.Join(os.Getenv("LCHAT_DATA_DIR"), "record"))

func openRecord(path string) *record {
	r := &record{high: map[string]uint64{}, changed: make(chan struct{})}
	if os.Getenv("LCHAT_DATA_DIR") == "" {
		return r
	}
	if f, err := os.Open(path); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			l := sc.Text()
			conn, rest, _ := strings.Cut(l, " ")
			seqs, _, _ := strings.Cut(rest, " ")
			seq, err := strconv.ParseUint(seqs, 10, 64)
			if err != nil {
				break // a line cut by a crash: never acknowledged
			}
			r.lines = append(r.lines, l)
			r.high[conn] = max(r.high[conn], seq)
		}
		f.Close()
	}
	r.path = path
	return r
}

// seen reports whether conn's message seq was applied already.
func (r *record) seen(conn string, seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return seq <= r.high[conn]
}

// apply records conn's message seq; false when it was applied already (a redelivery).
func (r *record) apply(conn string, seq uint64, payload string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq <= r.high[conn] {
		return false
	}
	l := fmt.Sprintf("%s %d %s", conn, seq, payload)
	if r.f == nil {
		f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			log.Fatal(err)
		}
		r.f = f
	}
	if _, err := r.f.WriteString(l + "\n"); err != nil {
		log.Fatal(err)
	}
	r.lines = append(r.lines, l)
	r.high[conn] = seq
	close(r.changed)
	r.changed = make(chan struct{})
	return true
}

// after is the lines after the first n, and a channel closed at the next append.
func (r *record) after(n int) ([]string, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n > len(r.lines) {
		n = len(r.lines)
	}
	return append([]string(nil), r.lines[n:]...), r.changed
}

// closeLog keeps the close events this instance got: "<conn> <code>".
type closeLog struct {
	mu    sync.Mutex
	lines []string
}

var closes closeLog

func (c *closeLog) note(conn, code string) {
	c.mu.Lock()
	c.lines = append(c.lines, conn+" "+code)
	c.mu.Unlock()
}

// soakEvent answers the soak and bad-client tests' text events; false for any other.
//
//	apply <x>   record x once; answer "ack <x>", or "dup <x>" for a redelivery dropped
//	bcast <x>   the same, and send "bcast <x>" to the tag room first
//	slow <x>    answer "ack <x>" after 100 ms (a flood outruns it)
//	flood <n> <size>  send up to n messages of size bytes to this connection through
//	            the control endpoint, until one is refused; answer the statuses
//	ctl <method> <path>  call the control endpoint; answer "<status> <body>"
//	whoami      answer "id <conn>"
func soakEvent(w http.ResponseWriter, r *http.Request, body []byte, control *http.Client) bool {
	conn := r.Header.Get("Lchat-Conn-Id")
	verb, arg, _ := strings.Cut(string(body), " ")
	answer := func(format string, a ...any) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, format, a...)
	}
	switch verb {
	case "apply", "bcast":
		seq, err := strconv.ParseUint(r.Header.Get("Lchat-Seq"), 10, 64)
		if err != nil {
			http.Error(w, "bad Lchat-Seq", http.StatusBadRequest)
			return true
		}
		if rec.seen(conn, seq) {
			if r.Header.Get("Lchat-Redelivery") != "1" {
				answer("baddup %s", arg) // a message applied before, not marked
				return true
			}
			answer("dup %s", arg)
			return true
		}
		if verb == "bcast" {
			resp, err := control.Post("http://box/.lchat/ws/send?tag=room", "text/plain", strings.NewReader("bcast "+arg))
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return true
			}
			resp.Body.Close()
		}
		rec.apply(conn, seq, verb+" "+arg)
		answer("ack %s", arg)
	case "slow":
		time.Sleep(100 * time.Millisecond)
		answer("ack %s", arg)
	case "flood":
		var n, size int
		fmt.Sscan(arg, &n, &size)
		msg := strings.Repeat("f", size)
		var codes []string
		for range n {
			resp, err := control.Post("http://box/.lchat/ws/send?conn="+conn, "text/plain", strings.NewReader(msg))
			if err != nil {
				codes = append(codes, "err")
				continue
			}
			resp.Body.Close()
			codes = append(codes, strconv.Itoa(resp.StatusCode))
			if resp.StatusCode != http.StatusNoContent {
				break // the connection is gone
			}
		}
		answer("flooded %s", strings.Join(codes, ","))
	case "ctl":
		method, path, _ := strings.Cut(arg, " ")
		req, _ := http.NewRequest(method, "http://box"+path, strings.NewReader("from "+conn))
		resp, err := control.Do(req)
		if err != nil {
			answer("ctl error %v", err)
			return true
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
	case "whoami":
		answer("id %s", conn)
	default:
		return false
	}
	return true
}

func soakRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /record", func(w http.ResponseWriter, r *http.Request) {
		lines, _ := rec.after(0)
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
	})
	mux.HandleFunc("GET /closes", func(w http.ResponseWriter, r *http.Request) {
		closes.mu.Lock()
		defer closes.mu.Unlock()
		for _, l := range closes.lines {
			fmt.Fprintln(w, l)
		}
	})
	// The record as a resumable event stream: event i (id i) is the record's line i,
	// from the one after Last-Event-ID; it goes on as messages are applied.
	mux.HandleFunc("GET /soak/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Lchat-Sse", "resumable")
		n, _ := strconv.Atoi(r.Header.Get("Last-Event-ID"))
		rc := http.NewResponseController(w)
		w.WriteHeader(http.StatusOK)
		rc.Flush()
		for {
			lines, changed := rec.after(n)
			for _, l := range lines {
				n++
				fmt.Fprintf(w, "id: %d\ndata: %s\n\n", n, l)
			}
			if len(lines) > 0 {
				rc.Flush()
			}
			select {
			case <-r.Context().Done():
				return
			case <-changed:
			}
		}
	})
}
