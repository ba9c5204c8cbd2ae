package box

import (
	"context"
	"errors"
	"net/http"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

// Relocate moves a hibernating space to another region (mesh.Relocator), with the
// running config's DNS provider and region buckets. Its error says what was (not)
// changed, with the status of its kind: 400 malformed, 404 no route, 409 refused now, 502
// a store or DNS provider failed.
func (b *Box) Relocate(ctx context.Context, req mesh.RelocateRequest) (mesh.RelocateResult, error) {
	// An unknown host is "no route" whatever the box's config, as for every other command.
	if err := registry.ValidateHost(req.Host); err != nil {
		return mesh.RelocateResult{}, &Error{Status: http.StatusBadRequest, Err: err}
	}
	if _, ok := b.reg.Lookup(req.Host); !ok {
		return mesh.RelocateResult{}, fail(http.StatusNotFound, "no route for host %s", req.Host)
	}
	ms := b.mesh
	if ms == nil {
		return mesh.RelocateResult{}, &Error{Status: http.StatusConflict, Err: ErrMeshOff}
	}
	s := b.settings.Load()
	r := &mesh.Relocator{
		Node:          ms.node,
		Bucket:        b.bucket,
		RegionBuckets: s.RegionBuckets,
		DeadAfter:     ms.m.Config().DeadAfter,
		OpTimeout:     ms.m.Config().OpTimeout,
		Routes:        b.reg,
		AwakeHere:     b.eng.Here, // awake or waking here
		HolderLive:    ms.m.HolderLive,
		Replicator:    ms.repl,
		DNS:           s.RelocateDNS,
	}
	res, err := r.Relocate(ctx, req)
	if err != nil {
		status := http.StatusInternalServerError
		switch {
		case errors.Is(err, mesh.ErrRelocateInvalid):
			status = http.StatusBadRequest
		case errors.Is(err, mesh.ErrRelocateNotFound):
			status = http.StatusNotFound
		case errors.Is(err, mesh.ErrRelocateRefused):
			status = http.StatusConflict
		case errors.Is(err, mesh.ErrRelocateUpstream):
			status = http.StatusBadGateway
			b.logger.Error("relocate failed", zap.String("host", req.Host), zap.Error(err))
		}
		return res, &Error{Status: status, Err: errors.New(mesh.RelocateErrorMessage(err))}
	}
	b.logger.Info("space relocated", zap.String("host", req.Host), zap.String("from", res.From), zap.String("to", res.To),
		zap.String("store", res.Store), zap.String("dns", res.DNS))
	return res, nil
}
