package mesh

import (
	"context"

	"go.uber.org/zap"
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
