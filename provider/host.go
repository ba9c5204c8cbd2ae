package provider

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

// Hosting is what the provider API needs of the provider's fleet (box.Box).
type Hosting interface {
	// Lookup is host's route here, if any.
	Lookup(host string) (*registry.Route, bool)
	// Hosted counts the routes hosted for client.
	Hosted(client string) int
	// CreateHosted stores and fans out a new route hosted for client, held
	// (registry.ProviderReclaiming: asleep, served to nobody, never woken) until
	// SetHeld(false): the fleet resumes it once its own route names this provider, so the
	// space never runs on both sides.
	CreateHosted(ctx context.Context, spec registry.Spec, client string) (registry.Route, error)
	// SetHeld holds a hosted space asleep on every box (registry.ProviderReclaiming), or
	// serves it again.
	SetHeld(ctx context.Context, host string, held bool) (registry.Route, error)
	// Remove deletes host's route, its space saved first.
	Remove(ctx context.Context, host string) error
	// Bucket holds the fleet's spaces; Live judges their lease holders.
	Bucket() bucket.Bucket
	Live() spacestore.LiveFunc
	// TempDir is where an export is spooled.
	TempDir() string
}

// API carries out the provider API's operations for an authenticated client, each
// scoped to the routes hosted for it (Client.Owns, Client.MayHost). The glue
// (modules/lchat) authenticates, decodes, calls and encodes.
type API struct {
	F Hosting
	// Limits bound an export a client sends.
	Limits Limits
}

// ErrNotHeld refuses an export of a space that is not held asleep (hibernate first).
var ErrNotHeld = errors.New("the space is not held asleep for a take-back: hibernate it first")

func (a *API) owned(c *Client, host string) (*registry.Route, error) {
	rt, _ := a.F.Lookup(host)
	if err := c.Owns(rt); err != nil {
		return nil, err
	}
	return rt, nil
}

// Host hosts host for c (created true), held until Resume, or finds it already hosted
// for c.
func (a *API) Host(ctx context.Context, c *Client, host string, req CreateRequest) (st Status, created bool, err error) {
	cur, _ := a.F.Lookup(host)
	if err := c.MayHost(host, cur, a.F.Hosted(c.Name)); err != nil {
		return Status{}, false, err
	}
	if cur == nil {
		on := true
		if _, err := a.F.CreateHosted(ctx, registry.Spec{Host: host, Kind: req.Kind, Version: req.Version, Env: req.Env,
			Hibernate: &on}, c.Name); err != nil {
			return Status{}, false, err
		}
		created = true
	}
	st, err = a.Status(ctx, c, host)
	return st, created, err
}

// Status is host's status, for c.
func (a *API) Status(ctx context.Context, c *Client, host string) (Status, error) {
	rt, err := a.owned(c, host)
	if err != nil {
		return Status{}, err
	}
	st := Status{Host: host, Kind: rt.Kind, State: StateServing}
	if rt.ProviderState != "" {
		st.State = StateHeld
	}
	if err := spacestore.CheckAsleep(ctx, a.F.Bucket(), host, a.F.Live()); errors.Is(err, spacestore.ErrSpaceAwake) {
		st.Awake = true
	} else if err != nil {
		return Status{}, err
	}
	m, _, err := spacestore.ReadManifest(ctx, a.F.Bucket(), host)
	if err != nil {
		return Status{}, err
	}
	if m != nil {
		st.Generation = m.Generation
	}
	return st, nil
}

// Import takes host's state from c's export r into this fleet's bucket: before host is
// hosted, or while it is c's and asleep.
func (a *API) Import(ctx context.Context, c *Client, host string, r io.Reader) (Imported, error) {
	cur, _ := a.F.Lookup(host)
	if err := c.MayHost(host, cur, a.F.Hosted(c.Name)); err != nil {
		return Imported{}, err
	}
	cp, err := ReadExport(ctx, r, a.F.Bucket(), a.F.Live(), host, a.F.TempDir(), c.Token, a.Limits)
	if err != nil {
		return Imported{}, err
	}
	return Imported{Generation: cp.Generation, Objects: cp.Blobs, Bytes: cp.Bytes, Skipped: cp.Skipped}, nil
}

// Hibernate holds host asleep on every box of this fleet, and waits until it sleeps.
func (a *API) Hibernate(ctx context.Context, c *Client, host string) (Status, error) {
	if _, err := a.owned(c, host); err != nil {
		return Status{}, err
	}
	if stored, err := a.F.SetHeld(ctx, host, true); err != nil && stored.Host == "" {
		return Status{}, err
	}
	if err := waitAsleep(ctx, a.F.Bucket(), a.F.Live(), host); err != nil {
		return Status{}, err
	}
	return a.Status(ctx, c, host)
}

// Resume serves host: once it is hosted (Host holds it until then), or again after a
// Hibernate. Its next scheduled wake is recorded then, from its manifest.
func (a *API) Resume(ctx context.Context, c *Client, host string) (Status, error) {
	if _, err := a.owned(c, host); err != nil {
		return Status{}, err
	}
	if _, err := a.F.SetHeld(ctx, host, false); err != nil {
		return Status{}, err
	}
	if err := restoreWake(ctx, a.F.Bucket(), host); err != nil {
		return Status{}, fmt.Errorf("serving %s, but recording its next scheduled wake failed: %v", host, err)
	}
	return a.Status(ctx, c, host)
}

// Export writes host's state to w, signed for c: host must be held asleep. write is
// called once the export can begin (the glue sends its headers then).
func (a *API) Export(ctx context.Context, c *Client, host string, begin func() io.Writer) error {
	rt, err := a.owned(c, host)
	if err != nil {
		return err
	}
	if rt.ProviderState != registry.ProviderReclaiming {
		return ErrNotHeld
	}
	if err := spacestore.CheckAsleep(ctx, a.F.Bucket(), host, a.F.Live()); err != nil {
		return err
	}
	_, err = WriteExport(ctx, &lazyWriter{begin: begin}, a.F.Bucket(), a.F.Live(), host, a.F.TempDir(), c.SignToken)
	return err
}

// lazyWriter asks for its writer at the first write, so that a failure before it (the
// copy into the spool) is still an error status.
type lazyWriter struct {
	begin func() io.Writer
	w     io.Writer
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if l.w == nil {
		l.w = l.begin()
	}
	return l.w.Write(p)
}

// Delete stops hosting host for c: its route removed, its space saved first.
func (a *API) Delete(ctx context.Context, c *Client, host string) error {
	if _, err := a.owned(c, host); err != nil {
		return err
	}
	return a.F.Remove(ctx, host)
}
