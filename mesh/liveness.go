package mesh

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket"
)

// The lease-liveness rule. A space's lease names its holder's SELF and incarnation, and it
// is held exactly while that holder is live: a heartbeat for the SELF exists in the bucket,
// is fresh by the bucket's clock (younger than DeadAfter), and carries that incarnation.
// There are no renewal writes. The engine (who may take a lease), the relocation (is the
// space awake anywhere) and the fleet status all ask it through the functions below.

// liveIn is the rule applied to a set of live members (a view, or one fresh read): the
// holder is live iff a member has its SELF and incarnation. A lease without an
// incarnation is never live.
func liveIn(members []Member, self, incarnation string) bool {
	if incarnation == "" {
		return false
	}
	for _, m := range members {
		if m.Self == self {
			return m.Incarnation == incarnation
		}
	}
	return false
}

// LiveIn returns the rule over members, the live heartbeats of some bucket (as
// ReadMembers returns them): for leases in a bucket this box does not beat in.
func LiveIn(members []Member) func(holder, incarnation string) bool {
	return func(holder, incarnation string) bool { return liveIn(members, holder, incarnation) }
}

// IsLive applies the lease rule against the current view: the holder is live iff its
// heartbeat exists, is fresh, and carries incarnation. The view may be up to one beat old;
// CheckLive asks the bucket instead.
func (m *Membership) IsLive(self, incarnation string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return liveIn(m.view, self, incarnation)
}

// CheckLive applies the lease rule with a fresh read of the holder's heartbeat (one LIST,
// plus a GET when its ETag changed): use it before taking over a lease.
func (m *Membership) CheckLive(ctx context.Context, self, incarnation string) (bool, error) {
	if incarnation == "" {
		return false, nil
	}
	key := HeartbeatKey(self)
	// Every "dead" answer is logged with its reason: it lets this box take the holder's
	// leases over, and a wrong one is two writers.
	dead := func(now time.Time, why string, fields ...zap.Field) (bool, error) {
		m.logger.Warn("lease holder judged dead by a fresh read", append([]zap.Field{zap.String("holder", self),
			zap.String("incarnation", incarnation), zap.String("why", why), zap.Time("bucket_now", now)}, fields...)...)
		return false, nil
	}
	o, now, found, err := m.lastBeat(ctx, key)
	if err != nil {
		return false, fmt.Errorf("checking heartbeat: %v", err)
	}
	if !found {
		return dead(now, "no heartbeat")
	}
	if age := now.Sub(o.LastModified); age > m.cfg.DeadAfter {
		return dead(now, "heartbeat too old", zap.Duration("age", age), zap.Time("last_modified", o.LastModified))
	}
	if key == m.key {
		if incarnation != m.cfg.Incarnation {
			return dead(now, "an earlier incarnation of this box")
		}
		return true, nil
	}
	hb, err := m.reader.body(ctx, o)
	if errors.Is(err, bucket.ErrNotFound) {
		return dead(now, "heartbeat deleted while read")
	}
	if err != nil {
		m.reader.stats.getErrors.Add(1)
		return false, fmt.Errorf("checking heartbeat: %v", err)
	}
	if !liveIn([]Member{{Self: self, Incarnation: hb.Incarnation}}, self, incarnation) {
		return dead(now, "another incarnation beats", zap.String("beating", hb.Incarnation))
	}
	return true, nil
}

// lastBeat reads the heartbeat object at key afresh (one LIST, a HEAD when the listing
// misses it) and returns it with the bucket's time of the read; found false when there is
// none.
func (m *Membership) lastBeat(ctx context.Context, key string) (o bucket.Info, now time.Time, found bool, err error) {
	objs, now, _, err := m.reader.list(ctx, key)
	if err != nil {
		m.reader.stats.listErrors.Add(1)
		return bucket.Info{}, now, false, err
	}
	for i := range objs {
		if objs[i].Key == key {
			return objs[i], now, true, nil
		}
	}
	// Not listed. A listing that misses an object while it is overwritten (a store may
	// replace it by unlink and link) must not pass for a dead box: ask for the key itself.
	info, err := m.reader.head(ctx, key)
	if errors.Is(err, bucket.ErrNotFound) {
		return bucket.Info{}, now, false, nil
	}
	if err != nil {
		m.reader.stats.getErrors.Add(1)
		return bucket.Info{}, now, false, err
	}
	m.logger.Warn("a heartbeat was missing from a listing but exists", zap.String("key", key), zap.Int("listed", len(objs)))
	return info, now, true, nil
}

// SilentFor reads self's heartbeat afresh and returns how long ago, by the bucket's clock,
// it was last written; beating false when self has no heartbeat (it left the fleet, or never
// joined). A box that died keeps its last heartbeat: how long it has been silent tells a
// restart (seconds) from a box that is gone.
func (m *Membership) SilentFor(ctx context.Context, self string) (silent time.Duration, beating bool, err error) {
	o, now, found, err := m.lastBeat(ctx, HeartbeatKey(self))
	if err != nil || !found {
		return 0, false, err
	}
	return max(0, now.Sub(o.LastModified)), true, nil
}

// HolderLive is the rule as the engine and the relocation apply it to this box's bucket.
// The view says live: believe it (the holder fences itself before its heartbeat can look
// dead to anyone). The view says dead: confirm with a fresh read of the bucket before a
// takeover, so a one-beat-old view cannot steal a lease. A read that fails cannot tell,
// and counts as live: the request gets a forward or a 503, never a second writer.
func (m *Membership) HolderLive(holder, incarnation string) bool {
	if m.IsLive(holder, incarnation) {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.OpTimeout)
	defer cancel()
	live, err := m.CheckLive(ctx, holder, incarnation)
	if err != nil {
		m.logger.Warn("checking lease holder's heartbeat", zap.String("holder", holder), zap.Error(err))
		return true
	}
	return live
}
