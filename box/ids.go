package box

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/ledger"
	"github.com/lchat/lchat-caddy/registry"
)

// errNoMintDomain refuses a mint on a box that manages no wildcard domain.
var errNoMintDomain = errors.New("minting names hosts under the first wildcard domain, and this box has none (set LCHAT_WILDCARD_DOMAINS or wildcard_domains)")

// mint creates rt under a host minted from the next id: <base36(id)>.<first wildcard
// domain>, the id from the shared ledger of s.IDLedger, or else from a counter of this box
// beside its registry (ledger.Allocators.Source). A host that already has a route is
// skipped. rt is checked before an id is drawn, so a route this box would refuse costs no
// id.
func (b *Box) mint(ctx context.Context, s *Settings, rt registry.Route) (registry.Route, error) {
	if len(s.WildcardDomains) == 0 {
		return registry.Route{}, &Error{Status: http.StatusConflict, Err: errNoMintDomain}
	}
	domain := s.WildcardDomains[0]
	probe := rt
	probe.Host, _ = ledger.MintHost(1, domain)
	if err := b.checkRoute(&probe); err != nil {
		return registry.Route{}, fail(http.StatusBadRequest, "%v", err)
	}
	src, _, err := b.ids.Source(b.bucket, s.IDLedger, filepath.Join(filepath.Dir(b.cfg.Registry), "local-ids"))
	if err != nil {
		return registry.Route{}, fail(http.StatusServiceUnavailable, "minting a host: %v", err)
	}
	var stored registry.Route
	_, _, err = ledger.Mint(ctx, src, domain, func(host string) error {
		rt.Host = host
		s, err := b.reg.Create(rt)
		if errors.Is(err, registry.ErrExists) {
			return ledger.ErrTaken
		}
		stored = s
		return err
	})
	if err != nil {
		return registry.Route{}, fail(http.StatusServiceUnavailable, "minting a host: %v", err)
	}
	return stored, nil
}

// NextID allocates the next id of the shared ledger's namespace.
func (b *Box) NextID(ctx context.Context, namespace string) (uint64, error) {
	alloc, err := b.ids.Get(b.bucket, namespace)
	if err != nil {
		return 0, err
	}
	id, err := alloc.Next(ctx)
	if err != nil {
		return 0, fail(http.StatusServiceUnavailable, "allocating an id: %v", err)
	}
	return id, nil
}

// SeedIDs makes every id namespace hands out from now on at least min, and returns the
// lowest id it may hand out now. It refuses to lower the counter and then changes
// nothing.
func (b *Box) SeedIDs(ctx context.Context, namespace string, min uint64) (uint64, error) {
	next, err := b.ids.SeedAtLeast(ctx, b.bucket, namespace, min)
	switch {
	case errors.Is(err, ledger.ErrSeedZero):
		return 0, fail(http.StatusBadRequest, `body must set "min" (at least 1): the lowest id handed out from now on`)
	case errors.Is(err, ledger.ErrWouldLower):
		return 0, fail(http.StatusConflict, "%v; nothing was changed", err)
	case err != nil:
		return 0, err
	}
	b.logger.Info("id ledger seeded", zap.String("namespace", namespace), zap.Uint64("next", next))
	return next, nil
}
