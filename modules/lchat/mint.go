package lchat

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/lchat/lchat-caddy/ledger"
	"github.com/lchat/lchat-caddy/registry"
)

// errNoMintDomain refuses a mint on a box that manages no wildcard domain.
var errNoMintDomain = errors.New("minting names hosts under the first wildcard domain, and this box has none (set LCHAT_WILDCARD_DOMAINS or wildcard_domains)")

// mintSource is where minted ids come from (ledger.Allocators.Source): the shared
// ledger of LCHAT_CLOUD_ID_LEDGER, or else a counter of this box beside its registry.
func (a *App) mintSource() (ledger.IDSource, string, error) {
	return a.shared.ids.Source(a.shared.bucket, strings.TrimSpace(os.Getenv(envIDLedger)),
		filepath.Join(filepath.Dir(a.Registry), "local-ids"))
}

// mintRoute creates rt under a host minted from the next id: <base36(id)>.<first
// wildcard domain>. A host that already has a route is skipped. rt is checked before an
// id is drawn, so a route this box would refuse costs no id.
func (a *App) mintRoute(ctx context.Context, rt registry.Route) (registry.Route, error) {
	if len(a.WildcardDomains) == 0 {
		return registry.Route{}, errNoMintDomain
	}
	domain := a.WildcardDomains[0]
	probe := rt
	probe.Host, _ = ledger.MintHost(1, domain)
	if err := a.checkRoute(&probe); err != nil {
		return registry.Route{}, &mintInvalidError{err}
	}
	src, _, err := a.mintSource()
	if err != nil {
		return registry.Route{}, err
	}
	var stored registry.Route
	_, _, err = ledger.Mint(ctx, src, domain, func(host string) error {
		rt.Host = host
		s, err := a.shared.reg.Create(rt)
		if errors.Is(err, registry.ErrExists) {
			return ledger.ErrTaken
		}
		stored = s
		return err
	})
	return stored, err
}

// mintInvalidError is a route that would be refused whatever its host.
type mintInvalidError struct{ err error }

func (e *mintInvalidError) Error() string { return e.err.Error() }
func (e *mintInvalidError) Unwrap() error { return e.err }

// Interface guards
var _ error = (*mintInvalidError)(nil)
