package box

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/provider"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

// ProviderSide is the box as the provider seam sees it: the fleet that delegates
// (provider.Fleet) and the fleet that hosts (provider.Hosting). Both need the mesh:
// whether a space sleeps everywhere is read from its lease, judged by the fleet's
// heartbeats.
type ProviderSide struct{ b *Box }

// ProviderSide is b for the seam; without the mesh, a 409 (ErrMeshOff).
func (b *Box) ProviderSide() (ProviderSide, error) {
	if b.mesh == nil {
		return ProviderSide{}, &Error{Status: http.StatusConflict, Err: ErrMeshOff}
	}
	return ProviderSide{b}, nil
}

func (s ProviderSide) Route(host string) (registry.Route, error) { return s.b.reg.Get(host) }

func (s ProviderSide) SetDelegation(ctx context.Context, host, provider, state string) (registry.Route, error) {
	return s.b.SetDelegation(ctx, host, Delegation{Provider: provider, State: state})
}

func (s ProviderSide) Delegated(provider string) int { return s.b.Delegated(provider) }
func (s ProviderSide) Hosted(client string) int      { return s.b.Hosted(client) }
func (s ProviderSide) Bucket() bucket.Bucket         { return s.b.bucket }
func (s ProviderSide) Live() spacestore.LiveFunc     { return s.b.mesh.m.HolderLive }

// KeepsState refuses a route homed in a region whose spaces another bucket keeps
// (mesh.ElsewhereBucket): this box's Bucket has nothing of the space to hand over, and
// what it took back there would not be read by the boxes the space wakes on.
func (s ProviderSide) KeepsState(rt registry.Route) error {
	own := s.b.bucket.String()
	where := mesh.ElsewhereBucket(rt.HomeRegion, s.b.mesh.cfg.Region, own, s.b.settings.Load().RegionBuckets, s.b.mesh.node.Live())
	if where == "" {
		return nil
	}
	return fmt.Errorf("%s is homed in region %s, whose boxes keep spaces in bucket %s, not this box's %s", rt.Host, rt.HomeRegion, where, own)
}

func (s ProviderSide) Lookup(host string) (*registry.Route, bool) { return s.b.reg.Lookup(host) }

func (s ProviderSide) CreateHosted(ctx context.Context, spec registry.Spec, client string) (registry.Route, error) {
	return s.b.CreateHosted(ctx, spec, client)
}

func (s ProviderSide) SetHeld(ctx context.Context, host string, held bool) (registry.Route, error) {
	d := Delegation{}
	if held {
		d.State = registry.ProviderReclaiming
	}
	return s.b.SetDelegation(ctx, host, d)
}

func (s ProviderSide) Remove(ctx context.Context, host string) error {
	return s.b.Remove(ctx, host, false)
}

// TempDir is the spool of exports under the state directory (the box's own disk, 0700).
func (s ProviderSide) TempDir() string {
	dir := filepath.Join(s.b.cfg.StateDir, "exports")
	os.MkdirAll(dir, 0o700)
	return dir
}

// Interface guards
var (
	_ provider.Fleet   = ProviderSide{}
	_ provider.Hosting = ProviderSide{}
)
