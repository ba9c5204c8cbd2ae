package box

import (
	"context"
	"errors"
	"net/http"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/mesh"
)

// SeedRequest asks for a mesh-seed of one peer.
type SeedRequest struct {
	// Peer is the peer's SELF.
	Peer string
	// Region, Prune: mesh.PlanOptions.
	Region string
	Prune  bool
	// Domains override this box's mesh domains as the seed's scope.
	Domains []string
	// Token overrides this box's mesh token for the peer.
	Token mesh.Secret
}

// Seed is a planned mesh-seed, ready to run.
type Seed struct {
	b      *Box
	client mesh.Client
	peer   string
	puts   []mesh.RouteRow
	tombs  []mesh.Tombstone
	listed int
}

// PlanSeed reads this box's rows and the peer's and plans what the seed sends
// (mesh.Plan), sending nothing: every refusal comes before the first write.
func (b *Box) PlanSeed(ctx context.Context, req SeedRequest) (*Seed, error) {
	ms := b.mesh
	if ms == nil {
		return nil, &Error{Status: http.StatusConflict, Err: ErrMeshOff}
	}
	peer, err := mesh.ParseSelf(req.Peer)
	if err != nil {
		return nil, fail(http.StatusBadRequest, "peer: %v", err)
	}
	domains := ms.cfg.Domains
	if len(req.Domains) > 0 {
		domains = req.Domains
	}
	client := *ms.client
	if req.Token != "" {
		client.Token = req.Token
	}
	local, err := ms.node.Rows(b.reg)
	if err != nil {
		// A partial registry must never reach the planner: --prune would tombstone
		// every peer row the read missed.
		return nil, fail(http.StatusInternalServerError, "reading this box's routes; nothing was sent: %v", err)
	}
	remote, err := client.ListRoutes(ctx, peer)
	if err != nil {
		return nil, fail(http.StatusBadGateway, "listing the peer's routes: %v", err)
	}
	puts, tombs, err := mesh.Plan(local, remote, mesh.PlanOptions{Domains: domains, Region: req.Region, Prune: req.Prune})
	if errors.Is(err, mesh.ErrEmptySource) {
		return nil, fail(http.StatusConflict, "%v", err)
	}
	if err != nil {
		return nil, fail(http.StatusBadRequest, "%v", err)
	}
	return &Seed{b: b, client: client, peer: peer, puts: puts, tombs: tombs, listed: len(remote)}, nil
}

// Run sends the plan (mesh.RunSeed), emitting its progress, and returns the number of
// failures.
func (s *Seed) Run(ctx context.Context, emit func(mesh.SeedEvent)) int {
	fails := mesh.RunSeed(ctx, &s.client, s.peer, s.puts, s.tombs, s.listed, emit)
	s.b.logger.Info("mesh-seed done", zap.String("peer", s.peer), zap.Int("puts", len(s.puts)),
		zap.Int("tombstones", len(s.tombs)), zap.Int("failures", fails))
	return fails
}
