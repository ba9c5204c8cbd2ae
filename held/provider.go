package held

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/provider"
)

// Held WebSockets of a delegated space (docs/providers.md, "Held connections"): the
// fleet's entry box holds the client's socket as for any space, and its provider is one
// more kind of peer. On the fleet's side each event goes over the provider hop
// (eventDoor.Provider), its acknowledgement stamped as a peer stamps it, the instance
// named under the provider's name (providerAt) so that it is never taken for a box of
// the fleet; and one pull per delegated space with held connections (pullLoop) brings
// back what the space's instance sent to them through its control endpoint and the
// notices of what its checkpoints saved. On the provider's side the fleet's entry box is
// never called: what is for it waits in an outbox until its pull takes it (ServePull).

// providerAtPrefix begins the Box of an instance at a provider, as this fleet names it.
const providerAtPrefix = "provider/"

// providerAt is at, an instance on a box of provider name, as this fleet names it.
func providerAt(name string, at connhold.At) connhold.At {
	at.Box = providerAtPrefix + name + "/" + at.Box
	return at
}

// fromProviderAt is the provider and its own name of at, when at is a provider's.
func fromProviderAt(at connhold.At) (name string, inner connhold.At, ok bool) {
	rest, ok := strings.CutPrefix(at.Box, providerAtPrefix)
	if !ok {
		return "", at, false
	}
	name, at.Box, ok = strings.Cut(rest, "/")
	return name, at, ok
}

// SetProviders gives the transports of this config's providers (provider.Conn, by
// name; nil when there is none of that name): the events and pulls of held connections
// of delegated spaces go through them. Each config sets its own; the last one wins.
func (c *Conns) SetProviders(conn func(name string) http.RoundTripper) {
	c.providers.Store(&conn)
}

func (c *Conns) providerConn(name string) http.RoundTripper {
	f := c.providers.Load()
	if f == nil || *f == nil {
		return nil
	}
	return (*f)(name)
}

// Provider carries the event to the provider the space is delegated to, as a forward
// to a peer (Forward): with this box as its entry box and the provider's instances among
// its priors under their own names. The answer is the provider's: bounded and decoded
// as a peer's (readForwardedAnswer), its instance renamed under the provider's name.
func (d *eventDoor) Provider(name string) error {
	c, ev := d.c, d.ev
	rt := c.providerConn(name)
	if rt == nil {
		d.err = errEventRefused{box.Refusal{Status: http.StatusServiceUnavailable, Err: fmt.Errorf("provider %s is not configured on this box", name)}}
		return nil
	}
	req, err := connhold.NewEventRequest(d.ctx, "https://"+ev.Space, ev)
	if err != nil {
		d.err = err
		return nil
	}
	req.Header.Set(connhold.EntryHeader, c.box.Self())
	sent := make(map[connhold.At]connhold.At, len(ev.Prior))
	for _, p := range ev.Prior {
		wire := p
		if pn, inner, ok := fromProviderAt(p); ok && pn == name {
			wire = inner
		}
		sent[wire] = p
		req.Header.Add(connhold.PriorHeader, wire.String())
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		if box.IsDialError(err) || errors.As(err, new(provider.DialError)) {
			d.err = fmt.Errorf("%w: provider %s: %w", connhold.ErrNotDelivered, name, err)
		} else {
			d.err = fmt.Errorf("%w: provider %s: %w", connhold.ErrNotAcknowledged, name, err)
		}
		return nil
	}
	defer resp.Body.Close()
	reply, err := readForwardedAnswer(resp)
	if re, ok := connhold.IsReplay(err); ok {
		// Only the priors it was sent: a provider cannot name a box of this fleet.
		var stale []connhold.At
		for _, s := range re.Stale {
			if p, ok := sent[s]; ok {
				stale = append(stale, p)
			}
		}
		if len(stale) == 0 {
			err = fmt.Errorf("%w: provider %s asked for a replay of nothing it was sent", connhold.ErrNotAcknowledged, name)
		} else {
			err = &connhold.ReplayError{Stale: stale}
		}
	}
	if err == nil {
		reply.At = providerAt(name, reply.At)
		c.ackedAtProvider(ev.Space, reply.At)
		// Its pull may have ended (re-delegated, this box restarted its loop).
		c.HoldForProvider(ev.Space, name)
	}
	d.reply, d.err = reply, err
	return nil
}

// The pull: POST provider.PullPath with a listing of what the entry box holds of the
// space (pullListing, fleetconns.go), answered 200 with a body of pullItem (JSON, one a
// line) once something waits for the entry box, 204 after pullWait with nothing, or 409
// when the space is not awake there (a pull never wakes it).
const (
	pullWait = 25 * time.Second
	// pullProbe is how long an entry box waits for a wake of the space at its provider
	// (a request of it answered) before it pulls again anyway.
	pullProbe = 5 * time.Second
	// maxPullBytes bounds a pull's answer (as read by the entry box) and an outbox (as
	// kept by the provider's box: past it the oldest items are dropped).
	maxPullBytes = 16 << 20
	// outboxIdle is how long an outbox no pull takes from is kept.
	outboxIdle = 2 * time.Minute
)

// pullItem is one line of a pull's answer: a notice about the messages the space's
// instance acknowledged for the entry box, or a control call its instance made.
type pullItem struct {
	Notice  *connhold.Notice `json:"notice,omitempty"`
	Control *controlCall     `json:"control,omitempty"`
}

// controlCall is a control call (POST connhold.SendPath, ClosePath or SetPath) to be
// applied by the entry box to the connections of the space it holds.
type controlCall struct {
	Path   string            `json:"path"`
	Query  string            `json:"query,omitempty"`
	Header map[string]string `json:"header,omitempty"`
	Body   []byte            `json:"body,omitempty"`
}

// controlHeaders are the headers a control call carries between boxes (fanoutControl).
var controlHeaders = []string{"Content-Type", connhold.SetTagsHeader, connhold.SetMetaHeader, connhold.CloseHeader,
	connhold.CloseReasonHeader, connhold.AutoRequestHeader, connhold.AutoResponseHeader}

// outbox is what waits on the provider's box for one fleet entry box's pull of a space.
type outbox struct {
	items    [][]byte
	bytes    int
	ready    chan struct{} // closed when an item is added, replaced when taken
	pulls    int           // pulls waiting on it
	touched  time.Time
	pulledAt time.Time  // when a pull of it last began or ended
	fleet    fleetConns // the connections its entry box holds (fleetconns.go)
}

// outboxes are the provider's side: by host, by client entry (provider.ClientEntry).
type outboxes struct {
	mu sync.Mutex
	by map[string]map[string]*outbox
}

// isClientEntry reports whether entry is a fleet's entry box, which this box never calls.
func isClientEntry(entry string) bool { return strings.HasPrefix(entry, provider.ClientEntryPrefix) }

// touchLocked is host's outbox for entry, made if needed, touched now.
func (o *outboxes) touchLocked(host, entry string, now time.Time) *outbox {
	if o.by == nil {
		o.by = make(map[string]map[string]*outbox)
	}
	m := o.by[host]
	if m == nil {
		m = make(map[string]*outbox)
		o.by[host] = m
	}
	ob := m[entry]
	if ob == nil {
		ob = &outbox{ready: make(chan struct{})}
		m[entry] = ob
	}
	ob.touched = now
	return ob
}

// touch makes sure host's outbox for a client entry exists: from an upgrade or an event
// of that entry box on, the instance's sends for it are kept until its pull.
func (c *Conns) touch(host, entry string) {
	if !isClientEntry(entry) {
		return
	}
	c.out.mu.Lock()
	c.out.touchLocked(host, entry, time.Now())
	c.out.mu.Unlock()
}

// enqueue adds it to host's outboxes: entry's alone, or every one when entry is "".
// It reports whether there was any. An outbox no pull took from for outboxIdle is
// dropped; one past maxPullBytes loses its oldest items.
func (c *Conns) enqueue(host, entry string, it pullItem) bool {
	c.out.mu.Lock()
	defer c.out.mu.Unlock()
	if len(c.out.by[host]) == 0 {
		return false
	}
	line, err := json.Marshal(it)
	if err != nil {
		return false
	}
	now := time.Now()
	queued := false
	for e, ob := range c.out.by[host] {
		if ob.pulls == 0 && now.Sub(ob.touched) > outboxIdle {
			delete(c.out.by[host], e)
			continue
		}
		if entry != "" && e != entry {
			continue
		}
		queued = true
		ob.items = append(ob.items, line)
		ob.bytes += len(line)
		for ob.bytes > maxPullBytes && len(ob.items) > 1 {
			ob.bytes -= len(ob.items[0])
			ob.items = ob.items[1:]
			c.log.Warn("a fleet's entry box does not pull a delegated space's held-connection calls; dropping the oldest",
				zap.String("host", host))
		}
		close(ob.ready)
		ob.ready = make(chan struct{})
	}
	if len(c.out.by[host]) == 0 {
		delete(c.out.by, host)
	}
	return queued
}

// ServePull answers a fleet entry box's pull of host's outbox (entry, a client entry)
// on the box where the space is awake (the caller has released its use: a pull keeps
// the space awake no more than a held connection does): it keeps the pull's listing of
// what the entry box holds (fleetconns.go), and answers what waits, or what comes within
// pullWait, as JSON lines; 204 when nothing came. A pull with no valid listing is a
// *box.Error 400 (413 past its bound).
func (c *Conns) ServePull(w http.ResponseWriter, r *http.Request, host string) error {
	entry := r.Header.Get(connhold.EntryHeader)
	if !isClientEntry(entry) {
		return &box.Error{Status: http.StatusBadRequest, Err: errors.New("a pull names no fleet's entry box")}
	}
	l, err := readListing(r.Body)
	if errors.Is(err, errListingTooLarge) {
		return &box.Error{Status: http.StatusRequestEntityTooLarge, Err: err}
	} else if err != nil {
		return &box.Error{Status: http.StatusBadRequest, Err: err}
	}
	now := time.Now()
	c.out.mu.Lock()
	ob := c.out.touchLocked(host, entry, now)
	ob.pulls++
	ob.pulledAt = now
	ob.fleet.take(l, now)
	c.out.mu.Unlock()
	defer func() {
		c.out.mu.Lock()
		ob.pulls--
		ob.touched = time.Now()
		ob.pulledAt = ob.touched
		c.out.mu.Unlock()
	}()
	t := time.NewTimer(pullWait)
	defer t.Stop()
	for {
		c.out.mu.Lock()
		items, ready := ob.items, ob.ready
		if len(items) > 0 {
			ob.items, ob.bytes = nil, 0
		}
		c.out.mu.Unlock()
		if len(items) > 0 {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			for _, l := range items {
				w.Write(l)
				w.Write([]byte("\n"))
			}
			return nil
		}
		select {
		case <-ready:
		case <-t.C:
			w.WriteHeader(http.StatusNoContent)
			return nil
		case <-r.Context().Done():
			return nil
		case <-c.box.Exiting():
			w.WriteHeader(http.StatusNoContent)
			return nil
		}
	}
}

// clientControl is a space's control endpoint on the provider's side: it acts on the
// connections this box holds and on those the fleets' entry boxes hold, as a mesh's
// does across its boxes (docs/connections.md, "Across boxes"). A call for one connection
// this box does not hold is queued for the entry box that holds it (fleetHolders) and
// answered 204, or 404 when none does; a tag send is queued for every entry box and
// counts theirs (fleetCount); a listing adds theirs (fleetList). What this box does not
// answer itself is the entry boxes' word, as of their last pull and what this box saw since.
type clientControl struct {
	c     *Conns
	host  string
	local http.Handler
}

func (cc *clientControl) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == connhold.ConnsPath:
		cc.list(w, r)
		return
	case r.Method != http.MethodPost:
		cc.local.ServeHTTP(w, r)
		return
	}
	switch r.URL.Path {
	case connhold.SendPath, connhold.ClosePath, connhold.SetPath:
	default:
		cc.local.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20+1))
	if err != nil || len(body) > 16<<20 {
		http.Error(w, "body too large or unreadable", http.StatusRequestEntityTooLarge)
		return
	}
	call := &controlCall{Path: r.URL.Path, Query: r.URL.RawQuery, Body: body, Header: map[string]string{}}
	for _, k := range controlHeaders {
		if v := r.Header.Get(k); v != "" {
			call.Header[k] = v
		}
	}
	rec := record(cc.local, r, body)
	q, now := r.URL.Query(), time.Now()
	switch tag, id := q.Get("tag"), q.Get("conn"); {
	case r.URL.Path == connhold.SendPath && tag != "": // as the hub reads it: the tag first
		var n struct{ Sent int }
		if rec.code != http.StatusOK || json.Unmarshal(rec.body.Bytes(), &n) != nil {
			rec.writeTo(w) // a call the box refused: nothing queued
			return
		}
		cc.c.enqueue(cc.host, "", pullItem{Control: call})
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]int{"sent": n.Sent + cc.c.fleetCount(cc.host, tag, now)})
	case id != "" && rec.code == http.StatusNotFound:
		queued := false
		entries := cc.c.fleetHolders(cc.host, id, now)
		for _, e := range entries {
			queued = cc.c.enqueue(cc.host, e, pullItem{Control: call}) || queued
		}
		if !queued {
			rec.writeTo(w)
			return
		}
		ch := connChange{gone: r.URL.Path == connhold.ClosePath}
		if r.URL.Path == connhold.SetPath {
			ch = changeOf(r.Header)
		}
		for _, e := range entries {
			cc.c.sawConn(cc.host, e, id, ch)
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		rec.writeTo(w)
	}
}

// list answers a listing: this box's connections and the fleets' entry boxes'.
func (cc *clientControl) list(w http.ResponseWriter, r *http.Request) {
	rec := record(cc.local, r, nil)
	var all []connhold.ConnInfo
	if rec.code != http.StatusOK || json.Unmarshal(rec.body.Bytes(), &all) != nil {
		rec.writeTo(w)
		return
	}
	all = append(all, cc.c.fleetList(cc.host, r.URL.Query().Get("tag"), time.Now())...)
	slices.SortFunc(all, func(a, b connhold.ConnInfo) int { return strings.Compare(a.ID, b.ID) })
	if all == nil {
		all = []connhold.ConnInfo{}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(all)
}

// The states of a delegated space's pull (Conns.pulling).
const (
	pullRunning = 1 + iota // its loop runs
	pullAgain              // and was asked for since its last look: it looks again before it ends
)

// HoldForProvider notes that this box holds a WebSocket of host, delegated to the
// provider name (a connection accepted, or an event delivered there): one pull of host
// runs while it holds any and the space stays delegated there (pullLoop).
func (c *Conns) HoldForProvider(host, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pulling == nil {
		c.pulling = make(map[string]int)
	}
	switch {
	case c.done:
		return
	case c.pulling[host] != 0:
		c.pulling[host] = pullAgain
		return
	}
	c.pulling[host] = pullRunning
	safego.Go(nil, c.log, "pull of a delegated space's held connections", func() {
		for {
			c.pullLoop(host, name)
			c.mu.Lock()
			again := c.pulling[host] == pullAgain && c.ctx.Err() == nil
			if !again {
				delete(c.pulling, host)
			} else {
				c.pulling[host] = pullRunning
			}
			c.mu.Unlock()
			if !again {
				return
			}
		}
	})
}

// pullLoop pulls host's calls and notices from its provider name while this box holds
// connections of it and it is delegated there: again at once after an answer, after the
// space's next wake there (or pullProbe) when it is not awake.
func (c *Conns) pullLoop(host, name string) {
	for {
		if c.ctx.Err() != nil || c.hub.SpaceStats()[host].Open == 0 {
			return
		}
		if rt, ok := c.box.Lookup(host); !ok || rt.Provider != name {
			return
		}
		woke := c.wakeSignal(host)
		if c.pullOnce(host, name) {
			continue
		}
		t := time.NewTimer(pullProbe)
		select {
		case <-c.ctx.Done():
		case <-woke:
		case <-t.C:
		}
		t.Stop()
	}
}

// pullOnce makes one pull; false when it got no answer from the space's instance there
// (an error, the space asleep or moving).
func (c *Conns) pullOnce(host, name string) bool {
	rt := c.providerConn(name)
	if rt == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(c.ctx, pullWait+30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+host+provider.PullPath,
		bytes.NewReader(listingOf(c.hub.List(host, ""))))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(connhold.EntryHeader, c.box.Self())
	req.Header.Set(connhold.ReopenHeader, "1")
	resp, err := rt.RoundTrip(req)
	if errors.As(err, new(*provider.WireError)) {
		c.log.Warn("a provider speaks another version of the held-connection wire; its held connections get nothing back",
			zap.String("host", host), zap.String("provider", name), zap.Error(err))
		return false
	} else if err != nil {
		c.log.Debug("pulling a delegated space's held-connection calls", zap.String("host", host), zap.String("provider", name), zap.Error(err))
		return false
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNoContent:
		return true
	case http.StatusOK:
	default:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return false
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxPullBytes))
	for {
		var it pullItem
		if err := dec.Decode(&it); err != nil {
			if err != io.EOF {
				c.log.Warn("a provider's pull answer is malformed; the rest is dropped", zap.String("host", host),
					zap.String("provider", name), zap.Error(err))
			}
			return true
		}
		c.applyPulled(host, name, it)
	}
}

// applyPulled applies one item of host's pull from provider name, scoped to host: a
// notice of another space, a call to another path, are ignored.
func (c *Conns) applyPulled(host, name string, it pullItem) {
	if n := it.Notice; n != nil && n.Space == host {
		at, err := connhold.ParseAt(n.At)
		if err != nil {
			return
		}
		at = providerAt(name, at)
		if n.Gone {
			c.hub.RemoteGone(host, at, n.Covered)
		} else {
			c.hub.RemoteCovered(host, at, n.Covered)
		}
	}
	call := it.Control
	if call == nil {
		return
	}
	switch call.Path {
	case connhold.SendPath, connhold.ClosePath, connhold.SetPath:
	default:
		return
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+host+call.Path+"?"+call.Query, bytes.NewReader(call.Body))
	if err != nil {
		return
	}
	for _, k := range controlHeaders {
		if v, ok := call.Header[k]; ok {
			req.Header.Set(k, v)
		}
	}
	rec := &recorded{header: http.Header{}}
	c.hub.ControlHandler(host).ServeHTTP(rec, req)
}

// providerAtForget is how long an instance at a provider with nothing of this box's
// connections left pending is remembered (providerAts).
const providerAtForget = time.Minute

// providerAts are the instances at providers that acknowledged messages of connections
// this box holds, by host, each with when it last did (watchDelegations).
type providerAts struct {
	mu sync.Mutex
	by map[string]map[connhold.At]time.Time
}

// ackedAtProvider notes that at, an instance at a provider (providerAt), acknowledged a
// message of host's connections held here.
func (c *Conns) ackedAtProvider(host string, at connhold.At) {
	c.ats.mu.Lock()
	defer c.ats.mu.Unlock()
	if c.ats.by == nil {
		c.ats.by = make(map[string]map[connhold.At]time.Time)
	}
	m := c.ats.by[host]
	if m == nil {
		m = make(map[connhold.At]time.Time)
		c.ats.by[host] = m
	}
	m[at] = time.Now()
}

// watchDelegations runs leftProviders every second until Close.
func (c *Conns) watchDelegations() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case now := <-t.C:
			c.leftProviders(now)
		}
	}
}

// leftProviders delivers again what the instances at a provider acknowledged for host's
// connections and no pulled notice covered, once host's route no longer names that
// provider (reclaimed, removed): no heartbeat says what the provider's last checkpoint
// held, as a box of the fleet's does (watchPeers), and the pull that brings its notices
// ends with the delegation, so without this they would wait for the connection's next
// message. It reports how many instances it took for gone; an instance with nothing left
// pending here (connhold.Hub.RemoteBoxes) for providerAtForget is forgotten.
func (c *Conns) leftProviders(now time.Time) int {
	type left struct {
		host    string
		at      connhold.At
		pending bool
	}
	var gone []left
	pending := c.hub.RemoteBoxes()
	c.ats.mu.Lock()
	for host, m := range c.ats.by {
		rt, ok := c.box.Lookup(host)
		for at, last := range m {
			name, _, _ := fromProviderAt(at)
			held := slices.Contains(pending, [2]string{at.Box, at.Incarnation})
			switch {
			case !ok || rt.Provider != name:
				gone = append(gone, left{host, at, held})
			case now.Sub(last) > providerAtForget && !held:
			default:
				continue
			}
			delete(m, at)
		}
		if len(m) == 0 {
			delete(c.ats.by, host)
		}
	}
	c.ats.mu.Unlock()
	for _, g := range gone {
		// Covered 0: marks start at 1 (readForwardedAnswer), so every message it
		// acknowledged is delivered again.
		c.hub.RemoteGone(g.host, g.at, 0)
		if !g.pending {
			continue
		}
		c.log.Info("a space's route left its provider with held connections' messages its instance there acknowledged; delivering them again",
			zap.String("host", g.host), zap.String("instance", g.at.String()))
	}
	return len(gone)
}

// providerState is the fields of Conns for the provider seam.
type providerState struct {
	providers atomic.Pointer[func(name string) http.RoundTripper]
	out       outboxes
	ats       providerAts
}
