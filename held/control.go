package held

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/mesh"
)

// EnsureControl serves host's control endpoint (connhold.Hub.ControlHandler) on its Unix
// socket (engine.ControlSocketPath, LCHAT_CONTROL_SOCKET in the instance's environment),
// from the space's first held connection until the box closes. The socket is in a
// directory only the box writes; any uid may connect, and a caller whose uid is not the
// awake instance's (SO_PEERCRED) is hung up on: another space cannot act on this one's
// connections even knowing the path. With the mesh, a call also acts on the connections
// other boxes hold for the space (fanoutControl).
func (c *Conns) EnsureControl(host string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done || c.controls[host] != nil {
		return
	}
	path := engine.ControlSocketPath(c.stateDir, host)
	ln, err := listenControl(path)
	if err != nil {
		c.log.Error("serving a space's control endpoint", zap.String("host", host), zap.Error(err))
		return
	}
	var handler http.Handler = c.durableControl(host, &clientControl{c: c, host: host, local: c.hub.ControlHandler(host)})
	if c.box.Mesh() != nil {
		handler = &fanoutControl{c: c, host: host, local: handler}
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: zap.NewStdLog(c.log)}
	c.controls[host] = srv
	safego.Go(nil, c.log, "control endpoint", func() {
		srv.Serve(&peerListener{Listener: ln, ok: func(uid int) bool {
			want, awake := c.box.Engine().InstanceUID(host)
			return awake && uid == want
		}})
	})
}

// durableControl makes a control call that sends (a POST) wait until the commits the
// instance made before it are in the bucket (engine.Engine.WaitDurable: a kind that ships
// a log), as its answers do; one that cannot be shipped in time is a 503, sending nothing.
func (c *Conns) durableControl(host string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			if err := c.box.Engine().WaitDurable(r.Context(), host); err != nil {
				http.Error(w, "the space's writes are not durable yet; try again", http.StatusServiceUnavailable)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func listenControl(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	// The directory is the box's: no name in it can be swapped for a link.
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// peerListener accepts only callers whose uid ok allows.
type peerListener struct {
	net.Listener
	ok func(uid int) bool
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(conn)
		if err == nil && l.ok(uid) {
			return conn, nil
		}
		conn.Close()
	}
}

func peerUID(conn net.Conn) (int, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return -1, fmt.Errorf("not a unix connection")
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return -1, err
	}
	if cerr != nil {
		return -1, cerr
	}
	return int(cred.Uid), nil
}

// closeControlsLocked stops every control endpoint and removes its socket.
func (c *Conns) closeControlsLocked() {
	for host, srv := range c.controls {
		srv.Close()
		os.Remove(engine.ControlSocketPath(c.stateDir, host))
	}
	clear(c.controls)
}

// fanoutControl is a space's control endpoint on a mesh box: a call acts on the
// connections this box holds and, through the peer API (mesh.PathConns), on those the
// other live boxes hold for the space. A call for one connection stops at the box that
// has it; a tag send and a listing add up every box's.
type fanoutControl struct {
	c     *Conns
	host  string
	local http.Handler
}

func (f *fanoutControl) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20+1))
	if err != nil || len(body) > 16<<20 {
		http.Error(w, "body too large or unreadable", http.StatusRequestEntityTooLarge)
		return
	}
	rec := record(f.local, r, body)
	q := r.URL.Query()
	perConn := q.Get("conn") != ""
	if perConn && rec.code != http.StatusNotFound || rec.code/100 == 4 && rec.code != http.StatusNotFound || rec.code/100 == 5 {
		rec.writeTo(w)
		return
	}
	peers := f.peers()
	if len(peers) == 0 {
		rec.writeTo(w)
		return
	}
	answers := f.callPeers(r, body, peers)
	switch {
	case perConn:
		for _, a := range answers {
			if a.code != http.StatusNotFound && a.code != 0 {
				a.writeTo(w)
				return
			}
		}
		rec.writeTo(w)
	case r.URL.Path == connhold.ConnsPath:
		var all []connhold.ConnInfo
		for _, a := range append([]*recorded{rec}, answers...) {
			var list []connhold.ConnInfo
			if a.code == http.StatusOK && json.Unmarshal(a.body.Bytes(), &list) == nil {
				all = append(all, list...)
			}
		}
		slices.SortFunc(all, func(a, b connhold.ConnInfo) int { return strings.Compare(a.ID, b.ID) })
		if all == nil {
			all = []connhold.ConnInfo{}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(all)
	default: // a tag send
		total := 0
		for _, a := range append([]*recorded{rec}, answers...) {
			var n struct{ Sent int }
			if a.code == http.StatusOK && json.Unmarshal(a.body.Bytes(), &n) == nil {
				total += n.Sent
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]int{"sent": total})
	}
}

// peers are the other live boxes, and the boxes that hold connections of the space's
// instance here (a box that has just joined holds them before every view lists it).
func (f *fanoutControl) peers() []string {
	ms := f.c.box.Mesh()
	if ms == nil {
		return nil
	}
	var out []string
	for _, m := range ms.Membership().Live() {
		if m.Self != f.c.box.Self() {
			out = append(out, m.Self)
		}
	}
	for _, e := range f.c.relay.Entries(f.host) {
		if e != f.c.box.Self() && !isClientEntry(e) && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

// peerControlTimeout bounds one peer's part of a control call.
const peerControlTimeout = 3 * time.Second

// peerDownAfter is how long a peer's part may go unanswered before the peer counts as down
// (peerSkips), even when the call ended first because its caller gave up.
const peerDownAfter = time.Second

func (f *fanoutControl) callPeers(r *http.Request, body []byte, peers []string) []*recorded {
	ms := f.c.box.Mesh()
	hdr := http.Header{}
	for _, k := range []string{"Content-Type", connhold.SetTagsHeader, connhold.SetMetaHeader, connhold.CloseHeader,
		connhold.CloseReasonHeader, connhold.AutoRequestHeader, connhold.AutoResponseHeader} {
		if vs := r.Header.Values(k); len(vs) > 0 {
			hdr[http.CanonicalHeaderKey(k)] = vs
		}
	}
	path := peerControlPath(f.host, r.URL.Path)
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	call, probe := f.c.skips.plan(peers, time.Now())
	for _, peer := range probe {
		safego.Go(nil, f.c.log, "probe a peer left out of control calls", func() { f.probe(peer) })
	}
	out := make([]*recorded, len(call))
	var wg sync.WaitGroup
	for i, peer := range call {
		wg.Go(func() {
			out[i] = &recorded{header: http.Header{}}
			ctx, cancel := context.WithTimeout(r.Context(), peerControlTimeout)
			defer cancel()
			start := time.Now()
			resp, err := ms.Client().Call(ctx, r.Method, peer, path, hdr, body)
			if err != nil {
				// A caller that gave up early (its instance's own timeout) says nothing of
				// the peer; one that waited peerDownAfter for it does.
				if (r.Context().Err() == nil || time.Since(start) >= peerDownAfter) && f.c.skips.failed(peer, time.Now()) {
					f.c.log.Warn("a peer's part of a control call failed: control calls leave it out until it answers a probe",
						zap.String("host", f.host), zap.String("peer", peer), zap.Error(err))
				}
				return
			}
			defer resp.Body.Close()
			f.c.skips.answered(peer)
			out[i].code = resp.StatusCode
			out[i].header = resp.Header
			io.Copy(&out[i].body, io.LimitReader(resp.Body, 16<<20))
		})
	}
	wg.Wait()
	return out
}

// peerControlPath is where a peer serves host's control call at local (a path under
// /.lchat on the instance's control endpoint).
func peerControlPath(host, local string) string {
	return mesh.PathConns + url.PathEscape(host) + strings.TrimPrefix(local, "/.lchat")
}

// probe asks a peer left out of control calls for the space's connection listing, which
// changes nothing: an answer of any status brings it back (peerSkips).
func (f *fanoutControl) probe(peer string) {
	ctx, cancel := context.WithTimeout(f.c.ctx, peerControlTimeout)
	defer cancel()
	resp, err := f.c.box.Mesh().Client().Call(ctx, http.MethodGet, peer, peerControlPath(f.host, connhold.ConnsPath), nil, nil)
	if err != nil {
		if f.c.ctx.Err() == nil {
			f.c.skips.failed(peer, time.Now())
		}
		return
	}
	resp.Body.Close()
	if f.c.skips.answered(peer) {
		f.c.log.Info("a peer left out of control calls answers again", zap.String("host", f.host), zap.String("peer", peer))
	}
}

// recorded is an answer kept to be merged.
type recorded struct {
	code   int
	header http.Header
	body   bytes.Buffer
}

func (a *recorded) Header() http.Header { return a.header }
func (a *recorded) Write(b []byte) (int, error) {
	if a.code == 0 {
		a.code = http.StatusOK
	}
	return a.body.Write(b)
}
func (a *recorded) WriteHeader(code int) {
	if a.code == 0 {
		a.code = code
	}
}

func (a *recorded) writeTo(w http.ResponseWriter) {
	for k, v := range a.header {
		w.Header()[k] = v
	}
	w.WriteHeader(max(a.code, http.StatusOK))
	w.Write(a.body.Bytes())
}

func record(h http.Handler, r *http.Request, body []byte) *recorded {
	rec := &recorded{header: http.Header{}}
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(body))
	h.ServeHTTP(rec, r2)
	if rec.code == 0 {
		rec.code = http.StatusOK
	}
	return rec
}
