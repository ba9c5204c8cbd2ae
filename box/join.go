package box

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/mesh"
)

// joinSeedTimeout bounds the seeding of a box that joins: a peer that cannot be reached
// must not hold the start. What the seeding misses, the peers' catch-up sends once they
// see the box (mesh/catchup.go).
const joinSeedTimeout = 30 * time.Second

// seedOnJoin gives a box that joins the mesh the rows of its scope, before its first
// heartbeat: from then on peers place spaces on it and forward their requests to it, and
// a load balancer sends it clients, so a host it lacked would be a 404 to a client until
// the peers' catch-up reached it. It reads every live peer's routes (GET
// /api/mesh/routes, what mesh-seed sends) and stores each row of its own scope as a
// replicated row (ApplyRow: by revision, so a row it holds newer, or a newer tombstone,
// wins). Rows older than the tombstone TTL come too, which a catch-up never sends a box
// that lacks them. A failure is logged and the box starts: the catch-up remains.
func (b *Box) seedOnJoin() {
	ms := b.mesh
	ctx, cancel := context.WithTimeout(context.Background(), joinSeedTimeout)
	defer cancel()
	start := time.Now()
	mc := ms.m.Config()
	members, err := mesh.ReadMembers(ctx, b.bucket, mc.DeadAfter, mc.OpTimeout)
	if err != nil {
		b.logger.Warn("joining the mesh: reading its members to seed this box failed; the peers' catch-up will send the rows", zap.Error(err))
		return
	}
	var peers, failed, rows, stored int
	for _, m := range members {
		if m.Self == ms.cfg.Self {
			continue
		}
		peers++
		listed, err := ms.client.ListRoutes(ctx, m.Self)
		if err != nil {
			failed++
			b.logger.Warn("joining the mesh: listing a peer's routes failed", zap.String("peer", m.Self), zap.Error(err))
			continue
		}
		for _, row := range listed {
			if !mesh.RouteInScope(mesh.NormalizeHost(row.Host), row.HomeRegion, ms.cfg.Domains, ms.cfg.Region) {
				continue
			}
			rows++
			if held, ok := b.reg.Lookup(row.Host); ok && row.Rev != "" && held.Rev >= row.Rev {
				// Held at this revision or newer (a box that restarts): ApplyRow would
				// find it stale, after a write transaction of its own.
				continue
			}
			a, err := b.ApplyRow(ctx, row)
			switch {
			case err != nil:
				failed++
				b.logger.Warn("joining the mesh: a peer's row was refused", zap.String("peer", m.Self), zap.String("host", row.Host), zap.Error(err))
			case !a.Stale && !a.Kept:
				stored++
			}
		}
	}
	if peers == 0 {
		return
	}
	b.logger.Info("joining the mesh: seeded from the peers", zap.Int("peers", peers), zap.Int("rows", rows),
		zap.Int("stored", stored), zap.Int("failures", failed), zap.Duration("took", time.Since(start)))
}
