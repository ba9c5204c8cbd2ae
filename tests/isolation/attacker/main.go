// Command attacker is the instance of the isolation tests: a space that tries to reach
// what it must not. It serves HTTP on $LCHAT_SOCKET; each endpoint makes one attempt and
// answers what happened as JSON ({"ok":bool,"err":"...","out":"..."}), so the test, not
// this program, decides what counts as denied.
//
//	GET  /healthz                   200
//	GET  /whoami                    uid, gid, groups, capability sets, pid
//	POST /read?path=P               read a file (or list a directory)
//	POST /write?path=P              create a file with a marker
//	POST /dial?path=P               connect to a Unix socket
//	POST /signal?pid=N&sig=S        send signal S (a number) to pid N
//	POST /escape                    setsid + double fork a sleeper; answers its pid
//	POST /hog                       allocate memory until killed
//	POST /flood?mb=N                write N MiB to stdout (the instance log)
//	POST /hijack?target=P           replace this instance's socket with a symlink to P
//	POST /connect?addr=A[&net=udp]  connect to A (TCP: ok once connected, out is the
//	                                server's first line; UDP: ok once a datagram is sent)
//	POST /resolve?name=N[&server=S] look N up through /etc/resolv.conf's resolver, or S
//	POST /interfaces                this instance's network interfaces
//	POST /fill?path=P&mb=N          append zeros to P, 1 MiB at a time and synced, until
//	                                a write fails or N MiB are written; out is the bytes
//	                                written, err the failure
//	POST /remove?path=P             remove P
//	GET  /hold                      a WebSocket upgrade: held by the box (Lchat-Ws: hold);
//	                                its events (POST /.lchat/ws/event) are acknowledged
//	POST /control?path=P            GET /.lchat/ws/conns from the control endpoint at P
//	                                (a held connection's box API): out is "<status> <body>"
//
// Paths may name $LCHAT_DATA_DIR.
// Every answer carries ms, how long the attempt took.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

type result struct {
	OK  bool    `json:"ok"`
	Err string  `json:"err,omitempty"`
	Out string  `json:"out,omitempty"`
	MS  float64 `json:"ms"`
}

func answer(w http.ResponseWriter, out string, err error) {
	answerTimed(w, out, err, 0)
}

func answerTimed(w http.ResponseWriter, out string, err error, d time.Duration) {
	r := result{OK: err == nil, Out: out, MS: d.Seconds() * 1000}
	if err != nil {
		r.Err = err.Error()
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(r)
}

func main() {
	switch os.Getenv("ATTACKER_MODE") {
	case "mid":
		// The middle of the double fork: start the sleeper in a new session and exit,
		// so the sleeper is orphaned, outside the instance's process group and session.
		c := exec.Command(os.Args[0])
		c.Env = append(os.Environ(), "ATTACKER_MODE=leaf")
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := c.Start(); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(c.Process.Pid)
		os.Exit(0)
	case "leaf":
		signal.Ignore(syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT)
		for {
			time.Sleep(time.Hour)
		}
	}
	sock := os.Getenv("LCHAT_SOCKET")
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(1)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, r *http.Request) {
		st, err := os.ReadFile("/proc/self/status")
		var lines []string
		for l := range strings.SplitSeq(string(st), "\n") {
			if strings.HasPrefix(l, "Cap") || strings.HasPrefix(l, "Uid:") || strings.HasPrefix(l, "Gid:") ||
				strings.HasPrefix(l, "Groups:") || strings.HasPrefix(l, "Pid:") || strings.HasPrefix(l, "NoNewPrivs:") {
				lines = append(lines, l)
			}
		}
		answer(w, strings.Join(lines, "\n"), err)
	})
	mux.HandleFunc("/read", func(w http.ResponseWriter, r *http.Request) {
		p := os.ExpandEnv(r.URL.Query().Get("path"))
		fi, err := os.Stat(p)
		if err == nil && fi.IsDir() {
			ents, err := os.ReadDir(p)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			answer(w, strings.Join(names, ","), err)
			return
		}
		b, err := os.ReadFile(p)
		answer(w, string(b), err)
	})
	mux.HandleFunc("/write", func(w http.ResponseWriter, r *http.Request) {
		answer(w, "", os.WriteFile(os.ExpandEnv(r.URL.Query().Get("path")), []byte("written by "+os.Getenv("LCHAT_HOST")), 0o644))
	})
	mux.HandleFunc("/hold", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Lchat-Ws", "hold")
	})
	mux.HandleFunc("/.lchat/ws/event", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("/control", func(w http.ResponseWriter, r *http.Request) {
		p := os.ExpandEnv(r.URL.Query().Get("path"))
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", p)
			}}}
		resp, err := c.Get("http://control/.lchat/ws/conns")
		if err != nil {
			answer(w, "", err)
			return
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer(w, fmt.Sprintf("%d %s", resp.StatusCode, body), err)
	})
	mux.HandleFunc("/dial", func(w http.ResponseWriter, r *http.Request) {
		c, err := net.Dial("unix", r.URL.Query().Get("path"))
		if err == nil {
			c.Close()
		}
		answer(w, "", err)
	})
	mux.HandleFunc("/signal", func(w http.ResponseWriter, r *http.Request) {
		pid, _ := strconv.Atoi(r.URL.Query().Get("pid"))
		sig, _ := strconv.Atoi(r.URL.Query().Get("sig"))
		if pid <= 0 {
			answer(w, "", fmt.Errorf("bad pid %d", pid))
			return
		}
		answer(w, "", syscall.Kill(pid, syscall.Signal(sig)))
	})
	mux.HandleFunc("/escape", func(w http.ResponseWriter, r *http.Request) {
		c := exec.Command(os.Args[0])
		c.Env = append(os.Environ(), "ATTACKER_MODE=mid")
		out, err := c.Output()
		answer(w, strings.TrimSpace(string(out)), err)
	})
	mux.HandleFunc("/hog", func(w http.ResponseWriter, r *http.Request) {
		var keep [][]byte
		for {
			b := make([]byte, 4<<20)
			for i := range b {
				b[i] = byte(i)
			}
			keep = append(keep, b)
		}
	})
	mux.HandleFunc("/flood", func(w http.ResponseWriter, r *http.Request) {
		mb, _ := strconv.Atoi(r.URL.Query().Get("mb"))
		line := []byte(strings.Repeat("flood ", 170) + "\n") // 1 KiB
		for range mb * 1024 {
			os.Stdout.Write(line)
		}
		answer(w, "", nil)
	})
	mux.HandleFunc("/connect", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		network := "tcp"
		if q.Get("net") == "udp" {
			network = "udp"
		}
		start := time.Now()
		c, err := net.DialTimeout(network, q.Get("addr"), 5*time.Second)
		var out string
		if err == nil && network == "udp" {
			_, err = c.Write([]byte("x"))
		}
		d := time.Since(start)
		if err == nil && network == "tcp" {
			c.SetReadDeadline(time.Now().Add(time.Second))
			b := make([]byte, 64)
			n, _ := c.Read(b)
			out = strings.TrimSpace(string(b[:n]))
		}
		if c != nil {
			c.Close()
		}
		answerTimed(w, out, err, d)
	})
	mux.HandleFunc("/resolve", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		res := &net.Resolver{PreferGo: true}
		if s := q.Get("server"); s != "" {
			res.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(s, "53"))
			}
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		start := time.Now()
		addrs, err := res.LookupHost(ctx, q.Get("name"))
		answerTimed(w, strings.Join(addrs, ","), err, time.Since(start))
	})
	mux.HandleFunc("/interfaces", func(w http.ResponseWriter, r *http.Request) {
		ifs, err := net.Interfaces()
		var names []string
		for _, i := range ifs {
			names = append(names, i.Name)
		}
		answer(w, strings.Join(names, ","), err)
	})
	mux.HandleFunc("/fill", func(w http.ResponseWriter, r *http.Request) {
		mb, _ := strconv.Atoi(r.URL.Query().Get("mb"))
		f, err := os.OpenFile(os.ExpandEnv(r.URL.Query().Get("path")), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			answer(w, "0", err)
			return
		}
		defer f.Close()
		chunk := make([]byte, 1<<20)
		var n int64
		for range mb {
			k, err := f.Write(chunk)
			n += int64(k)
			if err == nil {
				err = f.Sync()
			}
			if err != nil {
				answer(w, strconv.FormatInt(n, 10), err)
				return
			}
		}
		answer(w, strconv.FormatInt(n, 10), nil)
	})
	mux.HandleFunc("/remove", func(w http.ResponseWriter, r *http.Request) {
		answer(w, "", os.Remove(os.ExpandEnv(r.URL.Query().Get("path"))))
	})
	var hijacked atomic.Bool
	mux.HandleFunc("/hijack", func(w http.ResponseWriter, r *http.Request) {
		// The listener keeps its socket; the path the box dials now leads elsewhere.
		// Every answer from now on closes its connection, so the box must dial again.
		hijacked.Store(true)
		w.Header().Set("Connection", "close")
		tmp := sock + ".new"
		err := os.Symlink(r.URL.Query().Get("target"), tmp)
		if err == nil {
			err = os.Rename(tmp, sock)
		}
		answer(w, "", err)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if hijacked.Load() {
			w.Header().Set("Connection", "close")
		}
		w.Write([]byte("attacker " + os.Getenv("LCHAT_HOST") + " " + r.URL.Path))
	})
	fmt.Println("attacker listening for", os.Getenv("LCHAT_HOST"))
	http.Serve(ln, mux)
}
