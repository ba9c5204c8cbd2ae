package connhold

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestEventClientReusesAndRedials checks that events reach the instance as HTTP requests
// with their headers, over one kept-alive connection, and that a connection the instance
// closed while idle is not reused once it has been idle for freshIdle (the next event is
// delivered, not failed).
func TestEventClientReusesAndRedials(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seqs []string
	remotes := map[string]bool{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seqs = append(seqs, r.Header.Get(SeqHeader))
		remotes[r.RemoteAddr+r.Context().Value(http.LocalAddrContextKey).(net.Addr).String()] = true
		mu.Unlock()
		if r.Method != http.MethodPost || r.URL.Path != EventPath || r.Header.Get(EventHeader) != "text" || r.Host != "s1" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Write([]byte("ok"))
	})}
	conns := 0
	srv.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	go srv.Serve(ln)
	defer srv.Close()

	cl := &EventClient{Socket: sock}
	post := func(seq uint64) {
		t.Helper()
		r, err := PostEvent(context.Background(), cl, "http://s1", Event{ConnID: "c", Seq: seq, Kind: KindText, Payload: []byte("x")})
		if err != nil {
			t.Fatalf("event %d: %v", seq, err)
		}
		if len(r.Messages) != 1 || string(r.Messages[0].Payload) != "ok" {
			t.Fatalf("event %d: answer %+v", seq, r)
		}
	}
	post(1)
	post(2)
	post(3)
	mu.Lock()
	if conns != 1 {
		t.Errorf("3 events used %d connections, want 1 kept alive", conns)
	}
	mu.Unlock()

	// The instance closes its idle connections (as at its idle timeout). Its side of the
	// connection turns idle only after the answer was written, which may be after the
	// client read it: close idle connections until the client's one is found closed.
	cl.mu.Lock()
	c := cl.idle[0]
	cl.mu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); alive(c); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the instance's server never closed the idle connection")
		}
		srv.SetKeepAlivesEnabled(false)
		srv.SetKeepAlivesEnabled(true)
	}
	// A connection idle for less than freshIdle is reused unasked (a busy connection's
	// events save the system call); past it, the client asks, and redials.
	time.Sleep(freshIdle)
	post(4)
	mu.Lock()
	defer mu.Unlock()
	if conns != 2 {
		t.Errorf("after the instance closed the idle connection: %d connections, want 2", conns)
	}
	if len(seqs) != 4 || seqs[3] != "4" {
		t.Errorf("instance saw sequence numbers %v, want 1..4", seqs)
	}
}

// TestEventClientTakesAnAnswerBeforeTheBody: an instance that answers an event without
// reading its body (or before reading all of it) has acknowledged it. Go's server closes
// such a connection past 256 KiB unread; another server may say it will close and stop
// reading at once. Either way the answer is the event's, whole, the client does not wait
// for the rest of the body to be taken, and the next event goes through. An instance that
// reads every body keeps its one connection, whatever the body's size.
func TestEventClientTakesAnAnswerBeforeTheBody(t *testing.T) {
	answer := patterned(300 << 10)
	goServer := unixInstance(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(answer)
	}))
	// stalled reads a request's header, answers that it will close the connection, and
	// then neither reads nor closes it.
	stalled := filepath.Join(t.TempDir(), "stalled.sock")
	ln, err := net.Listen("unix", stalled)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	var heldMu sync.Mutex
	defer func() {
		heldMu.Lock()
		defer heldMu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			heldMu.Lock()
			held = append(held, nc)
			heldMu.Unlock()
			go func() {
				if _, err := http.ReadRequest(bufio.NewReader(nc)); err != nil {
					return
				}
				fmt.Fprintf(nc, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", len(answer))
				nc.Write(answer)
			}()
		}
	}()
	reader := unixInstance(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(answer)
	}))
	for _, sock := range []struct {
		name, path string
		keeps      bool // reads every body: the connection is kept for the next event
	}{{"go server", goServer, false}, {"stalled", stalled, false}, {"reads the body", reader, true}} {
		cl := &EventClient{Socket: sock.path}
		for _, n := range []int{inlineBody, inlineBody + 1, 256 << 10, 256<<10 + 1, 1 << 20} {
			t.Run(fmt.Sprintf("%s/%d", sock.name, n), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				for seq := uint64(1); seq <= 2; seq++ {
					r, err := PostEvent(ctx, cl, "http://s1", Event{ConnID: "c", Seq: seq, Kind: KindBinary, Payload: patterned(n)})
					if err != nil {
						t.Fatalf("event %d: %v", seq, err)
					}
					if len(r.Messages) != 1 || !bytes.Equal(r.Messages[0].Payload, answer) {
						t.Fatalf("event %d: the answer did not come back whole", seq)
					}
					if sock.keeps && cl.Idle() != 1 {
						t.Errorf("event %d: %d idle connections, want the one kept", seq, cl.Idle())
					}
				}
			})
		}
	}
}
