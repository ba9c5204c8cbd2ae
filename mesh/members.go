package mesh

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket"
)

// Member is one box of the mesh as seen through its heartbeat.
type Member struct {
	// Self is the member's base URL and identity (the decoded heartbeat key).
	Self string `json:"self"`
	// Region is the member's LCHAT_MESH_REGION; empty means region-agnostic.
	Region string `json:"region,omitempty"`
	// Domains are the mesh domains the member covers.
	Domains []string `json:"domains,omitempty"`
	// Incarnation changes every time the member's process starts.
	Incarnation string `json:"incarnation,omitempty"`
	// Version is the member's software version.
	Version string `json:"version,omitempty"`
	// Address is the member's advertised public address, if any.
	Address string `json:"address,omitempty"`
	// Bucket names the member's bucket (no credentials), if advertised.
	Bucket string `json:"bucket,omitempty"`
	// LastModified is the heartbeat's time by the bucket's clock.
	LastModified time.Time `json:"last_modified"`
	// Age is how old the heartbeat is by the bucket's clock, as of the listing that
	// produced this view plus the local monotonic time since.
	Age time.Duration `json:"age"`
	// Draining is set while the member shuts down: it is still live (its leases hold)
	// but takes no new spaces and no replicated rows.
	Draining bool `json:"draining,omitempty"`
	// Load is the member's published memory (warm set, budget, awake spaces), as of its
	// heartbeat body.
	Load
}

// memberReader reads who is live in one bucket from the heartbeats under MembersPrefix: it
// lists them (every page, each request under its own timeout), judges each by the bucket's
// clock (LastModified against the listing's Date; this box's clock only when the store
// reports none) and decodes their bodies. Bodies are cached by ETag and read again only
// when it changes, which is what makes a beat's steady state cost no GETs (see
// Membership). A Membership runs one on every beat; ReadMembers runs one once over a
// bucket this box does not beat in.
type memberReader struct {
	b         bucket.Bucket
	deadAfter time.Duration
	// opTimeout bounds each bucket request.
	opTimeout time.Duration
	logger    *zap.Logger
	stats     readCounters

	mu sync.Mutex
	// bodies caches heartbeat bodies by key.
	bodies map[string]cachedBody
}

// readCounters count a memberReader's requests. A failed body read the reader passes over
// (it keeps the last body) it counts itself; a failed read that its caller reports (a
// listing, CheckLive's fresh read) the caller counts, so each failure is counted once.
type readCounters struct {
	lists, listErrors, gets, getErrors, clockFallbacks atomic.Int64
}

// cachedBody is a heartbeat body as of one ETag.
type cachedBody struct {
	etag string
	hb   Heartbeat
}

// ownBody gives the body of the reading box's own heartbeat for a listed object, and
// false for any other key: a box does not read back what it wrote.
type ownBody func(o bucket.Info) (Heartbeat, bool)

// newMemberReader returns a reader of b's heartbeats with an empty body cache.
func newMemberReader(b bucket.Bucket, deadAfter, opTimeout time.Duration, logger *zap.Logger) *memberReader {
	return &memberReader{b: b, deadAfter: deadAfter, opTimeout: opTimeout, logger: logger, bodies: map[string]cachedBody{}}
}

// ReadMembers reads the live members of the heartbeats in b once, by b's own clock, with
// the same reader a Membership runs on every beat (paged listing, per-request timeout,
// the local clock only when the store reports none) but without joining: the boxes of a
// region whose heartbeats live in another bucket than this box's. A member whose body
// cannot be read is listed without one (no incarnation: it holds no lease).
func ReadMembers(ctx context.Context, b bucket.Bucket, deadAfter, opTimeout time.Duration) ([]Member, error) {
	if deadAfter <= 0 {
		deadAfter = DefaultDeadAfter
	}
	if opTimeout <= 0 {
		opTimeout = DefaultBeat
	}
	r := newMemberReader(b, deadAfter, opTimeout, zap.NewNop())
	objs, now, _, err := r.list(ctx, MembersPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing heartbeats in %s: %v", b, err)
	}
	return r.members(ctx, objs, now, nil), nil
}

// list reads every page under prefix and the bucket's clock at the first page. A store
// that reports no clock gets this box's instead, with fellBack set.
func (r *memberReader) list(ctx context.Context, prefix string) (objs []bucket.Info, now time.Time, fellBack bool, err error) {
	token := ""
	for {
		r.stats.lists.Add(1)
		lctx, cancel := context.WithTimeout(ctx, r.opTimeout)
		page, err := r.b.List(lctx, prefix, token)
		cancel()
		if err != nil {
			return nil, time.Time{}, false, err
		}
		if now.IsZero() {
			now = page.Now
		}
		objs = append(objs, page.Objects...)
		if page.NextToken == "" {
			break
		}
		token = page.NextToken
	}
	if now.IsZero() {
		r.stats.clockFallbacks.Add(1)
		return objs, time.Now(), true, nil
	}
	return objs, now, false, nil
}

// members turns one listing of MembersPrefix, judged at the bucket's time now, into the
// live members sorted by Self. own, when set, gives the reading box's own body; every
// other body comes through the cache, which then forgets the keys the listing no longer
// holds.
func (r *memberReader) members(ctx context.Context, objs []bucket.Info, now time.Time, own ownBody) []Member {
	view := make([]Member, 0, len(objs))
	seen := make(map[string]bool, len(objs))
	for _, o := range objs {
		self, ok := SelfFromKey(o.Key)
		if !ok {
			continue
		}
		seen[o.Key] = true
		age := now.Sub(o.LastModified)
		if age > r.deadAfter {
			continue
		}
		mem := Member{Self: self, LastModified: o.LastModified, Age: max(age, 0)}
		hb, ok := Heartbeat{}, false
		if own != nil {
			hb, ok = own(o)
		}
		if !ok {
			hb, ok = r.peerBody(ctx, o)
		}
		if ok {
			hb.ApplyTo(&mem)
		}
		view = append(view, mem)
	}
	r.mu.Lock()
	for k := range r.bodies {
		if !seen[k] {
			delete(r.bodies, k)
		}
	}
	r.mu.Unlock()
	sort.Slice(view, func(i, j int) bool { return view[i].Self < view[j].Self })
	return view
}

// peerBody returns a peer's heartbeat body, from the cache when its ETag is unchanged.
// On a failed read it returns the last body seen for that key, if any.
func (r *memberReader) peerBody(ctx context.Context, o bucket.Info) (Heartbeat, bool) {
	gctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	hb, err := r.body(gctx, o)
	if err == nil {
		return hb, true
	}
	if ctx.Err() == nil {
		r.stats.getErrors.Add(1)
		r.logger.Warn("reading a member's heartbeat", zap.String("key", o.Key), zap.Error(err))
	}
	r.mu.Lock()
	c, ok := r.bodies[o.Key]
	r.mu.Unlock()
	return c.hb, ok
}

// body returns the heartbeat body of the listed object o: the cached one while its ETag
// is unchanged, else read with one GET and cached.
func (r *memberReader) body(ctx context.Context, o bucket.Info) (Heartbeat, error) {
	r.mu.Lock()
	c, ok := r.bodies[o.Key]
	r.mu.Unlock()
	if ok && o.ETag != "" && c.etag == o.ETag {
		return c.hb, nil
	}
	r.stats.gets.Add(1)
	hb, etag, err := r.read(ctx, o.Key)
	if err != nil {
		return Heartbeat{}, err
	}
	r.mu.Lock()
	r.bodies[o.Key] = cachedBody{etag: etag, hb: hb}
	r.mu.Unlock()
	return hb, nil
}

// read GETs and decodes the heartbeat at key, returning its ETag.
func (r *memberReader) read(ctx context.Context, key string) (Heartbeat, string, error) {
	obj, err := r.b.Get(ctx, key)
	if err != nil {
		return Heartbeat{}, "", err
	}
	defer obj.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(obj.Body, 64*1024))
	if err != nil {
		return Heartbeat{}, "", err
	}
	hb, err := DecodeHeartbeat(raw)
	if err != nil {
		return Heartbeat{}, "", err
	}
	return hb, obj.ETag, nil
}

// head asks for the object at key itself, for a listing that may have missed it.
func (r *memberReader) head(ctx context.Context, key string) (bucket.Info, error) {
	hctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	return r.b.Head(hctx, key)
}

// refresh lists the members and rebuilds the view; on failure the last view stays.
func (m *Membership) refresh(ctx context.Context) {
	objs, now, fellBack, err := m.reader.list(ctx, MembersPrefix)
	if err != nil {
		if ctx.Err() == nil {
			m.reader.stats.listErrors.Add(1)
			m.logger.Warn("listing members; keeping the last view", zap.Error(err), zap.Int64("list_errors", m.reader.stats.listErrors.Load()))
		}
		return
	}
	// Both clocks are read as the listing returns, before any body is read, so the
	// offset measures the listing's Date and not the GETs after it.
	localAt := time.Now()
	wallAt := m.wall()
	view := m.reader.members(ctx, objs, now, m.ownBody)
	m.mu.Lock()
	m.view, m.viewAt = view, localAt
	if !fellBack {
		m.clock.offset = now.Sub(wallAt)
	}
	m.placement.SetView(view)
	m.mu.Unlock()
}

// ownBody is this box's heartbeat as its own view shows it: the body it writes, never
// read back. A listed ETag other than the one its last write got means that another
// process writes the same key.
func (m *Membership) ownBody(o bucket.Info) (Heartbeat, bool) {
	if o.Key != m.key {
		return Heartbeat{}, false
	}
	m.mu.Lock()
	etag := m.lastPutETag
	m.mu.Unlock()
	if etag != "" && o.ETag != "" && o.ETag != etag {
		m.stats.duplicateSelf.Add(1)
		m.logger.Error("another process writes this box's heartbeat: two boxes share one LCHAT_MESH_SELF", zap.String("self", m.cfg.Self))
	}
	return m.heartbeat(m.life.Draining()), true
}

// Placement is the owner cache over this membership's view: Owner at the cost of a map
// lookup, invalidated whenever a listing changes the members, their regions, domains or
// draining flags.
func (m *Membership) Placement() *Placement { return &m.placement }

// Live returns the live members (this box included when its heartbeat is fresh), sorted
// by Self, as of the last successful listing, with Age advanced by the local time since.
// The Domains slices are shared: treat them as read-only.
func (m *Membership) Live() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Member, len(m.view))
	copy(out, m.view)
	since := time.Since(m.viewAt)
	for i := range out {
		out[i].Age += since
	}
	return out
}

// Self returns this box as a member; Age is the time since its last successful
// heartbeat write was sent (by the local clock), LastModified is zero.
func (m *Membership) Self() Member {
	mem := Member{Self: m.cfg.Self}
	m.heartbeat(m.life.Draining()).ApplyTo(&mem)
	m.mu.Lock()
	if !m.lastPutSent.IsZero() {
		mem.Age = time.Since(m.lastPutSent)
	}
	m.mu.Unlock()
	return mem
}
