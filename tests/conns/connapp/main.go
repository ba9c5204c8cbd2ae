// Command connapp is the smallest instance that opts its WebSockets in to being held by
// the box (docs/connections.md), for tests/conns: it answers an upgrade of /ws with
// "Lchat-Ws: hold" and a welcome naming its pid, and each text event with
// "echo <text> from <pid>"; /events is a resumable server-sent event stream. soak.go adds
// the soak tests' durable record (apply, bcast, a resumable stream of the record) and the
// bad-client tests' helpers.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/coder/websocket"
)

func main() {
	sock := os.Getenv("LCHAT_SOCKET")
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatal(err)
	}
	pid := os.Getpid()
	control := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", os.Getenv("LCHAT_CONTROL_SOCKET"))
	}}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /ws", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Lchat-Conn-Id") == "" {
			http.Error(w, "no connection id", http.StatusBadRequest)
			return
		}
		w.Header().Set("Lchat-Ws", "hold")
		w.Header().Set("Lchat-Set-Tags", "room")
		w.Header().Set("Lchat-Auto-Request", "ping?")
		w.Header().Set("Lchat-Auto-Response", "pong!")
		fmt.Fprintf(w, "hello from %d", pid)
	})
	mux.HandleFunc("POST /.lchat/ws/event", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("Lchat-Event") != "text" {
			// Text events are not logged: /tunnel logs none of its messages either, and
			// TestLatencyFigures compares the two.
			log.Printf("event %s conn %s seq %s redelivery %s: %q", r.Header.Get("Lchat-Event"), r.Header.Get("Lchat-Conn-Id"),
				r.Header.Get("Lchat-Seq"), r.Header.Get("Lchat-Redelivery"), body)
		}
		if r.Header.Get("Lchat-Event") == "close" {
			closes.note(r.Header.Get("Lchat-Conn-Id"), r.Header.Get("Lchat-Close-Code"))
		}
		if r.Header.Get("Lchat-Event") != "text" {
			return
		}
		if soakEvent(w, r, body, control) {
			return
		}
		// "broadcast <text>": sent to every connection tagged room, through the box's
		// control endpoint, and no answer inline.
		if msg, ok := strings.CutPrefix(string(body), "broadcast "); ok {
			resp, err := control.Post("http://box"+"/.lchat/ws/send?tag=room", "text/plain", strings.NewReader(msg))
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			resp.Body.Close()
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		redelivered := ""
		if r.Header.Get("Lchat-Redelivery") == "1" {
			redelivered = " redelivered"
		}
		fmt.Fprintf(w, "echo %s from %d seq %s%s", body, pid, r.Header.Get("Lchat-Seq"), redelivered)
	})
	soakRoutes(mux)
	// A resumable event stream: one event numbered after Last-Event-ID, then half an
	// event the box must never pass on (its instance goes before it is finished).
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Lchat-Sse", "resumable")
		last := r.Header.Get("Last-Event-ID")
		n, _ := strconv.Atoi(last)
		fmt.Fprintf(w, "id: %d\ndata: %d from %d after %q\n\n", n+1, n+1, pid, last)
		fmt.Fprint(w, "data: half")
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	})
	// Today's byte tunnel, for comparison: a WebSocket the instance terminates itself.
	mux.HandleFunc("GET /tunnel", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, fmt.Appendf(nil, "echo %s from %d", b, pid)); err != nil {
				return
			}
		}
	})
	log.Fatal(http.Serve(ln, mux))
}
