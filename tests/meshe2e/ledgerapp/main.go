// Command ledgerapp is an instance that applies each message of its held WebSockets once
// (docs/connections.md): it keeps a ledger file in its data directory, one line per
// applied message ("<conn> <seq> <text>"), fsynced before it acknowledges, and drops a
// delivery whose sequence number is at or below the highest it applied for that
// connection. GET /ledger is the file. For tests/meshe2e's soak across kills and drains.
package main

import (
	"bufio"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

func main() {
	sock := os.Getenv("LCHAT_SOCKET")
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatal(err)
	}
	path := filepath.Join(os.Getenv("LCHAT_DATA_DIR"), "ledger")
	high := map[string]uint64{}
	if f, err := os.Open(path); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// A line a checkpoint caught half written has no newline and no third
			// field: that message was not acknowledged, and comes again.
			f := strings.SplitN(sc.Text(), " ", 3)
			if len(f) < 3 {
				continue
			}
			if n, err := strconv.ParseUint(f[1], 10, 64); err == nil && n > high[f[0]] {
				high[f[0]] = n
			}
		}
		f.Close()
	}
	ledger, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	pid := os.Getpid()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /ws", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Lchat-Ws", "hold")
		fmt.Fprintf(w, "hello from %d", pid)
	})
	mux.HandleFunc("GET /ledger", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		http.ServeFile(w, r, path)
	})
	mux.HandleFunc("POST /.lchat/ws/event", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Lchat-Event") != "text" {
			return
		}
		var body strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := r.Body.Read(buf)
			body.Write(buf[:n])
			if err != nil {
				break
			}
		}
		conn := r.Header.Get("Lchat-Conn-Id")
		seq, err := strconv.ParseUint(r.Header.Get("Lchat-Seq"), 10, 64)
		if err != nil || conn == "" {
			http.Error(w, "no connection or sequence", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if seq <= high[conn] {
			w.WriteHeader(http.StatusNoContent) // applied before: dropped
			return
		}
		if _, err := fmt.Fprintf(ledger, "%s %d %s\n", conn, seq, body.String()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := ledger.Sync(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		high[conn] = seq
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "ok %s", body.String())
	})
	log.Fatal(http.Serve(ln, mux))
}
