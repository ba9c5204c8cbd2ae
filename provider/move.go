package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/internal/backoff"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

// Moving a space out to its provider and back. Each move is a short state machine on the
// route (registry.Route.Provider and ProviderState), replicated to every box of the
// fleet, so no box serves the space while its state is in flight:
//
//	delegate: own ──> (P, delegating) ──[asleep here; state to P; P hosts it]──> (P, serving)
//	reclaim:  (P, serving) ──> (P, reclaiming) ──[P holds it asleep; state back]──> own ──> P drops it
//
// A failure half-way moves the route back to where it was, so exactly one side serves
// the space: a delegation that fails is the fleet's again, a reclaim that fails is the
// provider's again. Re-running a finished move changes nothing; re-running one left
// half-way (the box running it died) carries it on; reclaiming one left delegating
// takes it back at once (the provider never served it).

// Fleet is what a move needs of the fleet's side (box.Box and its bucket).
type Fleet interface {
	// Route is host's route (registry.ErrNotFound).
	Route(host string) (registry.Route, error)
	// SetDelegation stores host's delegation, puts the space to sleep on this box when
	// it is no longer the fleet's to run, and fans the row out.
	SetDelegation(ctx context.Context, host, provider, state string) (registry.Route, error)
	// Delegated counts the routes delegated to provider.
	Delegated(provider string) int
	// Bucket holds the fleet's spaces; Live judges their lease holders.
	Bucket() bucket.Bucket
	// KeepsState refuses a route whose space's state is not in Bucket (its home region
	// keeps spaces in another bucket), with an error that says where it is kept: a move
	// from Bucket would hand over an empty space, or take one back where its boxes do not
	// read it.
	KeepsState(rt registry.Route) error
	Live() spacestore.LiveFunc
	// TempDir is where an export is spooled.
	TempDir() string
}

// Errors of a move, by what the caller answers: ErrMoveInvalid 400, ErrMoveNotFound 404,
// ErrMoveRefused 409, ErrMoveUpstream 502 (the provider or a bucket failed; the message
// says where the space is served now).
var (
	ErrMoveInvalid  = errors.New("invalid move")
	ErrMoveNotFound = errors.New("no such route")
	ErrMoveRefused  = errors.New("move refused")
	ErrMoveUpstream = errors.New("move failed")
)

func moveErr(kind error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", kind, fmt.Sprintf(format, args...))
}

// Moved is what a move did.
type Moved struct {
	Host     string `json:"host"`
	Provider string `json:"provider"`
	// Already: the space was where the move takes it; nothing was done.
	Already bool `json:"already,omitempty"`
	// Generation is the state's manifest generation that moved (0: never checkpointed).
	Generation int64 `json:"generation"`
	// Objects and Bytes count what was copied into the destination's bucket.
	Objects int   `json:"objects"`
	Bytes   int64 `json:"bytes"`
	// Note says what is left to the provider (a reclaimed space it still lists).
	Note string `json:"note,omitempty"`
}

// asleepWait is how long a move waits for the space to sleep everywhere: the fleet's
// boxes settle the row as it reaches them, a drain's own bound beside.
const asleepWait = 90 * time.Second

// asleepPoll paces the reads of the lease while a move waits for the space to sleep:
// 100 ms, doubling to 2 s.
var asleepPoll = backoff.Curve{First: 100 * time.Millisecond, Max: 2 * time.Second}

// waitAsleep waits until host's lease in b is free by live.
func waitAsleep(ctx context.Context, b bucket.Bucket, live spacestore.LiveFunc, host string) error {
	ctx, cancel := context.WithTimeout(ctx, asleepWait)
	defer cancel()
	var wait time.Duration
	for {
		err := spacestore.CheckAsleep(ctx, b, host, live)
		if err == nil || !errors.Is(err, spacestore.ErrSpaceAwake) {
			return err
		}
		wait = asleepPoll.Next(wait)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%v after %s", err, asleepWait)
		case <-time.After(wait):
		}
	}
}

// setDelegation stores a delegation through f. A row stored whose sleep here failed
// (SetDelegation's route set beside its error) is no failure of the move: the wait for
// the space to sleep everywhere that follows decides.
func setDelegation(ctx context.Context, f Fleet, host, provider, state string) error {
	stored, err := f.SetDelegation(ctx, host, provider, state)
	if err != nil && stored.Host == "" {
		return err
	}
	return nil
}

// Delegate moves host's space to the provider c connects to.
func Delegate(ctx context.Context, f Fleet, c *Conn, host string) (Moved, error) {
	p := c.P
	res := Moved{Host: host, Provider: p.Name}
	rt, err := f.Route(host)
	if errors.Is(err, registry.ErrNotFound) {
		return res, moveErr(ErrMoveNotFound, "no route for host %s", host)
	}
	if err != nil {
		return res, err
	}
	switch {
	case !rt.Hibernate:
		return res, moveErr(ErrMoveRefused, "%s is a live route; only a hibernating space can be delegated", host)
	case rt.Provider == p.Name && rt.ProviderState == "":
		res.Already = true
		return res, nil
	case rt.Provider != "" && rt.Provider != p.Name:
		return res, moveErr(ErrMoveRefused, "%s is delegated to %s; reclaim it first", host, rt.Provider)
	case rt.ProviderState == registry.ProviderReclaiming:
		return res, moveErr(ErrMoveRefused, "%s is being reclaimed from %s; run reclaim again to finish it", host, p.Name)
	}
	if err := f.KeepsState(rt); err != nil {
		return res, moveErr(ErrMoveRefused, "%v: delegate it from a box of region %s; nothing was changed", err, rt.HomeRegion)
	}
	if rt.Provider == "" {
		if err := p.MayDelegate(host, f.Delegated(p.Name)); err != nil {
			return res, moveErr(ErrMoveRefused, "%v", err)
		}
		if err := setDelegation(ctx, f, host, p.Name, registry.ProviderDelegating); err != nil {
			return res, err
		}
	}
	// From here the fleet serves nothing of the space: back to its own on a failure.
	undo := func(step string, err error) (Moved, error) {
		if _, uerr := f.SetDelegation(context.WithoutCancel(ctx), host, "", ""); uerr != nil {
			return res, moveErr(ErrMoveUpstream, "delegating %s to %s failed %s: %v; and putting it back failed: %v; it is served by neither side until delegate or reclaim is run again", host, p.Name, step, err, uerr)
		}
		c.Delete(context.WithoutCancel(ctx), host)
		return res, moveErr(ErrMoveUpstream, "delegating %s to %s failed %s: %v; the space is served by this fleet, as before", host, p.Name, step, err)
	}
	if err := waitAsleep(ctx, f.Bucket(), f.Live(), host); err != nil {
		return undo("putting it to sleep", err)
	}
	imp, err := c.PutState(ctx, host, func(w io.Writer) error {
		_, err := WriteExport(ctx, w, f.Bucket(), f.Live(), host, f.TempDir(), p.Token)
		return err
	})
	if err != nil {
		return undo("handing its state over", err)
	}
	res.Generation, res.Objects, res.Bytes = imp.Generation, imp.Objects, imp.Bytes
	if _, err := c.Host(ctx, host, CreateRequest{Kind: rt.Kind, Version: rt.Version, Env: rt.Env}); err != nil {
		return undo("asking the provider to host it", err)
	}
	if err := setDelegation(ctx, f, host, p.Name, ""); err != nil {
		return undo("flipping its route", err)
	}
	return res, nil
}

// Reclaim moves host's space back from its provider (c connects to it).
func Reclaim(ctx context.Context, f Fleet, c *Conn, host string, lim Limits) (Moved, error) {
	p := c.P
	res := Moved{Host: host, Provider: p.Name}
	rt, err := f.Route(host)
	if errors.Is(err, registry.ErrNotFound) {
		return res, moveErr(ErrMoveNotFound, "no route for host %s", host)
	}
	if err != nil {
		return res, err
	}
	switch {
	case rt.Provider == "":
		res.Already, res.Provider = true, ""
		return res, nil
	case rt.Provider != p.Name:
		return res, moveErr(ErrMoveInvalid, "%s is delegated to %s, not %s", host, rt.Provider, p.Name)
	case rt.ProviderState == registry.ProviderDelegating:
		// Half-way out: the provider never served it, the state here is current.
		if _, err := f.SetDelegation(ctx, host, "", ""); err != nil {
			return res, err
		}
		if err := c.Delete(ctx, host); err != nil {
			res.Note = fmt.Sprintf("the provider may still list %s (its delete failed: %v); it serves it to nobody", host, err)
		}
		return res, nil
	}
	if err := f.KeepsState(rt); err != nil {
		return res, moveErr(ErrMoveRefused, "%v: reclaim it from a box of region %s; nothing was changed", err, rt.HomeRegion)
	}
	if rt.ProviderState == "" {
		if err := setDelegation(ctx, f, host, p.Name, registry.ProviderReclaiming); err != nil {
			return res, err
		}
	}
	undo := func(step string, err error) (Moved, error) {
		c.Resume(context.WithoutCancel(ctx), host)
		if _, uerr := f.SetDelegation(context.WithoutCancel(ctx), host, p.Name, ""); uerr != nil {
			return res, moveErr(ErrMoveUpstream, "reclaiming %s from %s failed %s: %v; and putting it back failed: %v; it is served by neither side until reclaim is run again", host, p.Name, step, err, uerr)
		}
		return res, moveErr(ErrMoveUpstream, "reclaiming %s from %s failed %s: %v; the space is served by %s, as before", host, p.Name, step, err, p.Name)
	}
	if _, err := c.Hibernate(ctx, host); err != nil {
		return undo("putting it to sleep at the provider", err)
	}
	var cp spacestore.CopyResult
	err = c.Export(ctx, host, func(r io.Reader) error {
		var err error
		cp, err = ReadExport(ctx, r, f.Bucket(), f.Live(), host, f.TempDir(), p.AcceptToken, lim)
		return err
	})
	if err != nil {
		return undo("taking its state back", err)
	}
	res.Generation, res.Objects, res.Bytes = cp.Generation, cp.Blobs, cp.Bytes
	if err := setDelegation(ctx, f, host, "", ""); err != nil {
		return undo("flipping its route", err)
	}
	if err := c.Delete(ctx, host); err != nil {
		res.Note = fmt.Sprintf("the provider still lists %s, held asleep and serving nobody (its delete failed: %v)", host, err)
	}
	return res, nil
}
