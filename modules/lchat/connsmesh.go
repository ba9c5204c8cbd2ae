package lchat

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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/mesh"
)

// Held connections across boxes (docs/connections.md, "Across boxes"): the entry box
// holds the client's socket and sends each event through the request path's one door
// (box.Serve) to wherever the space is awake; the box with the instance stamps each
// acknowledgement (connhold.Relay) and tells the entry box when a checkpoint saved it;
// an instance's control calls reach the connections other boxes hold through the peer
// API.

// at names the awake instance use holds on this box.
func (c *conns) at(use *engine.Use) connhold.At {
	at := connhold.At{Box: c.box.Self(), Incarnation: "-", Instance: use.Instance()}
	if ms := c.box.Mesh(); ms != nil {
		at.Incarnation = ms.Incarnation()
	}
	return at
}

// eventDoor carries one event through box.Serve (box.Proxy): to this box's instance,
// waking the space here, or forwarded once to the peer that runs it.
type eventDoor struct {
	c     *conns
	ctx   context.Context
	ev    connhold.Event
	reply connhold.Reply
	err   error
}

// errEventRefused wraps the box's refusal of an event (no route, unavailable): the event
// stays pending.
type errEventRefused struct{ ref box.Refusal }

func (e errEventRefused) Error() string {
	return fmt.Sprintf("event refused (%d): %v", e.ref.Status, e.ref.Err)
}

// Is: a refused event reached no instance.
func (e errEventRefused) Is(t error) bool { return t == connhold.ErrNotDelivered }

func (d *eventDoor) Instance(use *engine.Use) error {
	c, ev := d.c, d.ev
	now := c.at(use)
	if stale := connhold.StaleAt(ev.Prior, now); len(stale) > 0 {
		d.err = &connhold.ReplayError{Stale: stale}
		return nil
	}
	c.ensureControl(ev.Space)
	reply, err := connhold.PostEvent(d.ctx, c.client(ev.Space, use.Socket()), "http://"+ev.Space, ev)
	var ne *net.OpError
	if errors.As(err, &ne) && ne.Op == "dial" {
		use.Unreachable()
		err = fmt.Errorf("%w: %w", connhold.ErrNotDelivered, err)
	}
	reply.At = now
	d.reply, d.err = reply, err
	return nil
}

func (d *eventDoor) Live(string) error {
	d.err = fmt.Errorf("%s is a live route: it holds no connections", d.ev.Space)
	return nil
}

func (d *eventDoor) Refuse(ref box.Refusal) error {
	d.err = errEventRefused{ref}
	return nil
}

// Forward posts the event to the peer d names, marked as forwarded (box.PeerTransport):
// the peer delivers it to its instance and answers with the instance's answer and its
// acknowledgement's stamp (connhold.AckAtHeader), or 409 to ask for a replay first.
func (d *eventDoor) Forward(dec mesh.Decision) (box.Forwarded, error) {
	c, ev := d.c, d.ev
	u, err := url.Parse(dec.Peer)
	if err != nil {
		d.err = fmt.Errorf("forward: bad peer URL")
		return box.Answered, nil
	}
	req, err := connhold.NewEventRequest(d.ctx, u.Scheme+"://"+ev.Space, ev)
	if err != nil {
		d.err = err
		return box.Answered, nil
	}
	req = req.WithContext(box.WithPeer(req.Context(), box.Peer{Self: dec.Peer, Hint: dec.Hint}))
	req.Header.Set(connhold.EntryHeader, c.box.Self())
	for _, p := range ev.Prior {
		req.Header.Add(connhold.PriorHeader, p.String())
	}
	resp, err := c.peerTransport().RoundTrip(req)
	if err != nil {
		if isDialError(err) {
			c.box.Mesh().Box().Holders.Forget(ev.Space)
			return box.NotSent, err
		}
		d.err = err
		return box.Answered, nil
	}
	defer resp.Body.Close()
	d.reply, d.err = readForwardedAnswer(resp)
	return box.Answered, nil
}

// readForwardedAnswer decodes a peer's answer to a forwarded event.
func readForwardedAnswer(resp *http.Response) (connhold.Reply, error) {
	if resp.StatusCode == http.StatusConflict && len(resp.Header.Values(connhold.ReplayHeader)) > 0 {
		re := &connhold.ReplayError{}
		for _, v := range resp.Header.Values(connhold.ReplayHeader) {
			at, err := connhold.ParseAt(v)
			if err != nil {
				return connhold.Reply{}, fmt.Errorf("peer's replay answer: %w", err)
			}
			re.Stale = append(re.Stale, at)
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return connhold.Reply{}, re
	}
	if resp.StatusCode/100 != 2 {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		err := fmt.Errorf("%w: status %d from the peer", connhold.ErrNotAcknowledged, resp.StatusCode)
		if resp.Header.Get(connhold.RefusedHeader) != "" {
			err = fmt.Errorf("%w: %w", connhold.ErrNotDelivered, err)
		}
		return connhold.Reply{}, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxOpenAnswer+1))
	if err != nil {
		return connhold.Reply{}, fmt.Errorf("reading the peer's answer: %w", err)
	}
	reply, err := connhold.ParseReply(resp.Header, body)
	if err != nil {
		return connhold.Reply{}, err
	}
	if reply.At, err = connhold.ParseAt(resp.Header.Get(connhold.AckAtHeader)); err != nil {
		return connhold.Reply{}, fmt.Errorf("peer's acknowledgement: %w", err)
	}
	reply.Mark, _ = strconv.ParseUint(resp.Header.Get(connhold.AckMarkHeader), 10, 64)
	reply.Covered, _ = strconv.ParseUint(resp.Header.Get(connhold.CoveredHeader), 10, 64)
	if reply.Mark == 0 {
		return connhold.Reply{}, errors.New("peer's acknowledgement has no mark")
	}
	return reply, nil
}

// errDial marks an error from dialing a peer, before anything was sent.
var errDial = errors.New("dial")

type dialError struct{ err error }

func (e dialError) Error() string { return e.err.Error() }
func (e dialError) Unwrap() error { return e.err }
func (e dialError) Is(t error) bool {
	return t == errDial
}

func isDialError(err error) bool { return errors.Is(err, errDial) }

// peerTransport is the mesh's forward transport for events, made once.
func (c *conns) peerTransport() *box.PeerTransport {
	c.ptOnce.Do(func() {
		c.pt = c.box.Mesh().PeerTransport(func(err error) error { return dialError{err} })
	})
	return c.pt
}

// instanceEvent, on the box with the instance, delivers an event a peer forwarded for a
// connection it holds. An event whose connection's earlier acknowledgements were made by
// another instance is refused with 409 and the names of those instances
// (connhold.ReplayHeader), undelivered; otherwise its 2xx answer is stamped with this
// instance, the acknowledgement's mark and what a checkpoint covers.
func (p *proxying) instanceEvent(use *engine.Use, cs *conns) error {
	now := cs.at(use)
	var prior []connhold.At
	for _, v := range p.r.Header.Values(connhold.PriorHeader) {
		at, err := connhold.ParseAt(v)
		if err != nil {
			return caddyhttp.Error(http.StatusBadRequest, err)
		}
		prior = append(prior, at)
	}
	entry := p.r.Header.Get(connhold.EntryHeader)
	if entry == "" || !connhold.ValidID(p.r.Header.Get(connhold.ConnIDHeader)) {
		return caddyhttp.Error(http.StatusBadRequest, errors.New("a forwarded event names no entry box or no valid connection"))
	}
	if stale := connhold.StaleAt(prior, now); len(stale) > 0 {
		for _, s := range stale {
			p.w.Header().Add(connhold.ReplayHeader, s.String())
		}
		p.w.WriteHeader(http.StatusConflict)
		return nil
	}
	connhold.StripPeerHeaders(p.r.Header)
	cs.ensureControl(p.host)
	aw := &ackWriter{ResponseWriter: p.w, stamp: func(h http.Header) {
		mark, covered := cs.relay.Acked(p.host, now, entry, time.Now())
		h.Set(connhold.AckAtHeader, now.String())
		h.Set(connhold.AckMarkHeader, strconv.FormatUint(mark, 10))
		h.Set(connhold.CoveredHeader, strconv.FormatUint(covered, 10))
	}}
	return p.h.proxy.ServeHTTP(aw, p.r, p.next)
}

// ackWriter stamps a 2xx answer's header before it is written.
type ackWriter struct {
	http.ResponseWriter
	stamp func(http.Header)
	wrote bool
}

func (w *ackWriter) WriteHeader(code int) {
	if !w.wrote && code >= 200 {
		w.wrote = true
		if code/100 == 2 {
			w.stamp(w.ResponseWriter.Header())
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *ackWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *ackWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// instanceUpgradeForEntry, on the box with the instance, proxies an upgrade a peer
// forwarded for a client it will hold itself (connhold.EntryHeader): an opt-in answer is
// passed back to the entry box as it is (it completes the handshake), any other answer
// (a 101 and its tunnel) as today.
func (p *proxying) instanceUpgradeForEntry(use *engine.Use, cs *conns) error {
	entry := p.r.Header.Get(connhold.EntryHeader)
	if !connhold.ValidID(p.r.Header.Get(connhold.ConnIDHeader)) {
		return caddyhttp.Error(http.StatusBadRequest, errors.New("a forwarded upgrade names no valid connection"))
	}
	connhold.StripPeerHeaders(p.r.Header)
	cs.ensureControl(p.host)
	hw := &holdWriter{ResponseWriter: p.w}
	err := p.h.proxy.ServeHTTP(hw, p.r, p.next)
	if !hw.held {
		return err
	}
	cs.relay.Track(p.host, cs.at(use), entry)
	p.w.WriteHeader(hw.status)
	_, err = p.w.Write(hw.body.Bytes())
	return err
}

// forwardUpgrade, on the entry box, forwards a client's upgrade with a fresh connection
// id, asking the peer to pass an opt-in answer back: the client's socket is then held
// here, whichever box runs the space now or later.
func (p *proxying) forwardUpgrade(fr *http.Request, cs *conns) (held bool, err error) {
	id := connhold.NewID()
	fr.Header.Set(connhold.ConnIDHeader, id)
	fr.Header.Set(connhold.EntryHeader, p.h.app.box.Self())
	hw := &holdWriter{ResponseWriter: p.w}
	err = p.h.meshProxy.ServeHTTP(hw, fr, p.next)
	if !hw.held {
		return false, err
	}
	return true, p.hold(hw, id, cs)
}

// hold completes the handshake of a connection whose instance opted in (hw), and holds
// it on this box.
func (p *proxying) hold(hw *holdWriter, id string, cs *conns) error {
	reply, perr := connhold.ParseReply(hw.header, hw.body.Bytes())
	if perr != nil {
		return caddyhttp.Error(http.StatusBadGateway, fmt.Errorf("space %s: its answer holding a WebSocket: %w", p.host, perr))
	}
	for k := range p.w.Header() {
		delete(p.w.Header(), k)
	}
	if _, err := cs.hub.Accept(p.w, p.r, p.host, id, reply, hw.header.Get("Sec-WebSocket-Protocol")); err != nil {
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	cs.ensureControl(p.host)
	return nil
}

// tell sends n to the entry boxes that hold connections of its space, off the engine's
// goroutine, trying each a few times.
func (c *conns) tell(n connhold.Notice, entries []string) {
	ms := c.box.Mesh()
	if ms == nil {
		return
	}
	body, _ := json.Marshal(n)
	for _, entry := range entries {
		if entry == c.box.Self() || !ms.Box().IsLiveMember(entry) {
			continue
		}
		safego.Go(&c.tells, c.log, "held-connection notice", func() {
			for attempt, wait := 0, 200*time.Millisecond; attempt < 4; attempt, wait = attempt+1, wait*2 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := ms.Client().Call(ctx, http.MethodPost, entry, mesh.PathConns+"notice",
					http.Header{"Content-Type": {"application/json"}}, body)
				if err == nil {
					resp.Body.Close()
				}
				cancel()
				if err == nil && resp.StatusCode/100 == 2 {
					return
				}
				if c.closed() {
					return
				}
				time.Sleep(wait)
			}
			c.log.Warn("could not tell a box what became of its connections' messages; it delivers them again",
				zap.String("host", n.Space), zap.String("box", entry))
		})
	}
}

// askCheckpoint asks the box named peer for a checkpoint of space, whose instance there
// acknowledged messages of connections held here that pile up (connhold.Hub's
// NeedCheckpoint); the notice that follows its checkpoint frees them.
func (c *conns) askCheckpoint(ctx context.Context, space, peer string) {
	ms := c.box.Mesh()
	if ms == nil || !ms.Box().IsLiveMember(peer) {
		return
	}
	resp, err := ms.Client().Call(ctx, http.MethodPost, peer, mesh.PathConns+url.PathEscape(space)+"/checkpoint", nil, nil)
	if err != nil {
		c.log.Warn("asking a box for a checkpoint of held connections' messages", zap.String("host", space), zap.String("box", peer), zap.Error(err))
		return
	}
	resp.Body.Close()
}

// announceEvery is how often the hosts woken here are announced to the peers, which
// reopen the event streams they hold for them (sse.go): wakes are batched into one call
// per peer.
const announceEvery = 200 * time.Millisecond

// announce queues host, woken here, for the next announcement.
func (c *conns) announce(host string) {
	if c.box.Mesh() == nil {
		return
	}
	c.announceMu.Lock()
	if c.announced == nil {
		c.announced = make(map[string]struct{})
	}
	c.announced[host] = struct{}{}
	c.announceMu.Unlock()
}

// announcement is the body of POST PathConns+"awake".
type announcement struct {
	At    string   `json:"at"`
	Hosts []string `json:"hosts"`
}

func (c *conns) announceLoop(stop <-chan struct{}) {
	t := time.NewTicker(announceEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		c.announceMu.Lock()
		hosts := make([]string, 0, len(c.announced))
		for h := range c.announced {
			hosts = append(hosts, h)
		}
		clear(c.announced)
		c.announceMu.Unlock()
		if len(hosts) == 0 {
			continue
		}
		ms := c.box.Mesh()
		body, _ := json.Marshal(announcement{At: c.box.Self(), Hosts: hosts})
		for _, m := range ms.Membership().Live() {
			if m.Self == c.box.Self() {
				continue
			}
			safego.Go(nil, c.log, "wake announcement", func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				resp, err := ms.Client().Call(ctx, http.MethodPost, m.Self, mesh.PathConns+"awake",
					http.Header{"Content-Type": {"application/json"}}, body)
				if err != nil {
					c.log.Debug("announcing wakes", zap.String("peer", m.Self), zap.Error(err))
					return
				}
				resp.Body.Close()
			})
		}
	}
}

// announcedAt is the peer that last announced host's space awake; "" when none did.
func (c *conns) announcedAt(host string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.awakeAt[host]
}

// notice applies a Notice a peer sent about this box's connections.
func (c *conns) notice(n connhold.Notice) error {
	at, err := connhold.ParseAt(n.At)
	if err != nil {
		return err
	}
	if n.Gone {
		c.hub.RemoteGone(n.Space, at, n.Covered)
	} else {
		c.hub.RemoteCovered(n.Space, at, n.Covered)
	}
	return nil
}

// watchPeers delivers again what an instance on a box that left the mesh acknowledged
// and no Notice covered (connhold.Hub.BoxGone): that box cannot say what its last
// checkpoint held.
func (c *conns) watchPeers(stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ms := c.box.Mesh()
		if ms == nil {
			return
		}
		for _, k := range c.hub.RemoteBoxes() {
			if !ms.Membership().IsLive(k[0], k[1]) {
				if n := c.hub.BoxGone(k[0], k[1]); n > 0 {
					c.log.Info("a box left the mesh with held connections' messages unsaved; delivering them again",
						zap.String("box", k[0]), zap.Int("messages", n))
				}
			}
		}
	}
}

// fanoutControl is a space's control endpoint on a mesh box: a call acts on the
// connections this box holds and, through the peer API (mesh.PathConns), on those the
// other live boxes hold for the space. A call for one connection stops at the box that
// has it; a tag send and a listing add up every box's.
type fanoutControl struct {
	c     *conns
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
		if e != f.c.box.Self() && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

// peerControlTimeout bounds one peer's part of a control call.
const peerControlTimeout = 3 * time.Second

func (f *fanoutControl) callPeers(r *http.Request, body []byte, peers []string) []*recorded {
	ms := f.c.box.Mesh()
	hdr := http.Header{}
	for _, k := range []string{"Content-Type", connhold.SetTagsHeader, connhold.SetMetaHeader, connhold.CloseHeader,
		connhold.CloseReasonHeader, connhold.AutoRequestHeader, connhold.AutoResponseHeader} {
		if vs := r.Header.Values(k); len(vs) > 0 {
			hdr[http.CanonicalHeaderKey(k)] = vs
		}
	}
	path := mesh.PathConns + url.PathEscape(f.host) + strings.TrimPrefix(r.URL.Path, "/.lchat")
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	out := make([]*recorded, len(peers))
	var wg sync.WaitGroup
	for i, peer := range peers {
		wg.Go(func() {
			out[i] = &recorded{header: http.Header{}}
			ctx, cancel := context.WithTimeout(r.Context(), peerControlTimeout)
			defer cancel()
			resp, err := ms.Client().Call(ctx, r.Method, peer, path, hdr, body)
			if err != nil {
				f.c.log.Warn("a peer's part of a control call failed", zap.String("host", f.host), zap.String("peer", peer), zap.Error(err))
				return
			}
			defer resp.Body.Close()
			out[i].code = resp.StatusCode
			out[i].header = resp.Header
			io.Copy(&out[i].body, io.LimitReader(resp.Body, 16<<20))
		})
	}
	wg.Wait()
	return out
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

// servePeerConns serves the peer API's held-connection calls (mesh.PathConns), behind
// the mesh token: a Notice, or a control call on the connections of one host this box
// holds (never fanned out again).
func (c *conns) servePeerConns(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.Path, mesh.PathConns)
	if rest == "notice" {
		if r.Method != http.MethodPost {
			return caddyhttp.Error(http.StatusMethodNotAllowed, errors.New("POST a notice"))
		}
		var n connhold.Notice
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&n); err != nil {
			return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("notice: %v", err))
		}
		if err := c.notice(n); err != nil {
			return caddyhttp.Error(http.StatusBadRequest, err)
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if rest == "awake" {
		if r.Method != http.MethodPost {
			return caddyhttp.Error(http.StatusMethodNotAllowed, errors.New("POST an announcement"))
		}
		var an announcement
		if err := json.NewDecoder(io.LimitReader(r.Body, 4<<20)).Decode(&an); err != nil || an.At == "" {
			return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("announcement: %v", err))
		}
		if !c.box.Mesh().Box().IsLiveMember(an.At) {
			return caddyhttp.Error(http.StatusBadRequest, errors.New("announcement from a box that is not a live member"))
		}
		for _, h := range an.Hosts {
			if mesh.NormalizeHost(h) != h {
				continue
			}
			// Where it is awake, for the streams held here (sse.go); not a holder
			// hint for requests, which would go stale when the space sleeps there.
			c.mu.Lock()
			if c.awakeAt == nil {
				c.awakeAt = make(map[string]string)
			}
			c.awakeAt[h] = an.At
			c.mu.Unlock()
			c.signalWake(h)
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	host, op, ok := strings.Cut(rest, "/")
	if !ok || host == "" {
		return caddyhttp.Error(http.StatusNotFound, errors.New("no such held-connection call"))
	}
	host, err := url.PathUnescape(host)
	if err != nil || mesh.NormalizeHost(host) != host {
		return caddyhttp.Error(http.StatusBadRequest, errors.New("bad host in the path"))
	}
	if op == "checkpoint" {
		if r.Method != http.MethodPost {
			return caddyhttp.Error(http.StatusMethodNotAllowed, errors.New("POST a checkpoint request"))
		}
		// Off the request: the asking box does not wait for it (its notice will come).
		safego.Go(nil, c.log, "checkpoint for another box's held connections", func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c.box.Engine().CheckpointNow(ctx, host)
		})
		w.WriteHeader(http.StatusAccepted)
		return nil
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = "/.lchat/" + op
	c.hub.ControlHandler(host).ServeHTTP(w, r2)
	return nil
}
