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
//	delegate: own ──> (P, delegating) ──[asleep here; state to P; P hosts it, held]──> (P) ──> P resumes it
//	reclaim:  (P) ──> (P, reclaiming) ──[P holds it asleep; state back]──> own ──> P drops it
//
// The provider creates the route it hosts held (asleep, served to nobody, never woken,
// no scheduled wake recorded) and serves it only when asked to resume it, once the
// fleet's route names it: at no point can the space run on both sides. A failure
// half-way moves the route back to where it was, so exactly one side serves the space:
// a delegation that fails is the fleet's again (the provider's route deleted, or left
// held when its delete fails too), a reclaim that fails is the provider's again
// (resumed). A delegation whose resume failed is the one exception: the provider may
// have taken it, so the route is put back only once the provider deleted the space;
// otherwise it stays with the provider, which serves it or holds it asleep until
// delegate is run again. An error that leaves neither side serving says so. Re-running
// a finished move changes nothing (a delegation's asks the provider to resume it, which
// a box that died after the flip never did); re-running one left half-way (the box
// running it died) carries it on; reclaiming one left delegating takes it back at once
// (the provider never served it).

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

// moveRoute is host's route for a move; ErrMoveNotFound when there is none.
func moveRoute(f Fleet, host string) (registry.Route, error) {
	rt, err := f.Route(host)
	if errors.Is(err, registry.ErrNotFound) {
		return rt, moveErr(ErrMoveNotFound, "no route for host %s", host)
	}
	return rt, err
}

// Delegate moves host's space to the provider c connects to.
func Delegate(ctx context.Context, f Fleet, c *Conn, host string) (Moved, error) {
	p := c.P
	res := Moved{Host: host, Provider: p.Name}
	rt, err := moveRoute(f, host)
	if err != nil {
		return res, err
	}
	switch {
	case !rt.Hibernate:
		return res, moveErr(ErrMoveRefused, "%s is a live route; only a hibernating space can be delegated", host)
	case rt.Provider != "" && rt.Provider != p.Name:
		return res, moveErr(ErrMoveRefused, "%s is delegated to %s; reclaim it first", host, rt.Provider)
	case rt.ProviderState == registry.ProviderReclaiming:
		return res, moveErr(ErrMoveRefused, "%s is being reclaimed from %s; run reclaim again to finish it", host, p.Name)
	}
	handOver := rt.Provider == ""
	if rt.Provider == p.Name && rt.ProviderState == "" {
		// Delegated already: the provider serves it, unless the box that flipped the
		// route died before asking it to (it holds the space asleep until then).
		_, err := c.Resume(ctx, host)
		switch {
		case err == nil:
			res.Already = true
			return res, nil
		case !NotFound(err):
			return res, moveErr(ErrMoveUpstream, "%s is delegated to %s, which did not confirm it serves it: %v; run delegate again", host, p.Name, err)
		}
		// The provider hosts it no more (an undo's delete went through, its operator
		// removed it): hand it over again. What it saved stays in its bucket, and an
		// import never replaces a newer generation.
		handOver = true
	}
	if err := f.KeepsState(rt); err != nil {
		return res, moveErr(ErrMoveRefused, "%v: delegate it from a box of region %s; nothing was changed", err, rt.HomeRegion)
	}
	if rt.Provider == "" {
		if err := p.MayDelegate(host, f.Delegated(p.Name)); err != nil {
			return res, moveErr(ErrMoveRefused, "%v", err)
		}
	}
	if handOver {
		if err := setDelegation(ctx, f, host, p.Name, registry.ProviderDelegating); err != nil {
			return res, err
		}
	}
	// From here the fleet serves nothing of the space, and the provider holds what it
	// got asleep: back to the fleet on a failure.
	undo := func(step string, err error) (Moved, error) {
		return res, undoDelegate(context.WithoutCancel(ctx), f, c, host, false, moveErr(ErrMoveUpstream, "delegating %s to %s failed %s: %v", host, p.Name, step, err))
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
	if _, err := c.Resume(ctx, host); err != nil {
		return res, undoDelegate(context.WithoutCancel(ctx), f, c, host, true,
			moveErr(ErrMoveUpstream, "delegating %s to %s failed asking the provider to serve it: %v", host, p.Name, err))
	}
	return res, nil
}

// undoDelegate puts a delegation that failed (failed, ErrMoveUpstream) back: the route
// the fleet's again, the provider's deleted. The provider's route is held, so the route
// goes back first and a delete that fails leaves only a route serving nobody, which the
// error names. After a resume that failed (resumed: the provider may serve the space),
// the provider's delete comes first, and the route goes back only once it succeeded.
func undoDelegate(ctx context.Context, f Fleet, c *Conn, host string, resumed bool, failed error) error {
	p := c.P
	var derr error
	if resumed {
		if derr = c.Delete(ctx, host); derr != nil {
			return fmt.Errorf("%w; and deleting it there failed: %v; the route stays with %s, which serves the space if it took the resume, else holds it asleep: served by %s or by neither side until delegate is run again (or reclaim)", failed, derr, p.Name, p.Name)
		}
	}
	if _, err := f.SetDelegation(ctx, host, "", ""); err != nil {
		left := ""
		if resumed {
			left = fmt.Sprintf(" (%s deleted it)", p.Name)
		}
		return fmt.Errorf("%w; and putting it back failed: %v; it is served by neither side%s until delegate or reclaim is run again", failed, err, left)
	}
	if !resumed {
		derr = c.Delete(ctx, host)
	}
	left := ""
	if derr != nil {
		left = fmt.Sprintf("; %s may still list it, held asleep (serving nobody, never woken): its delete failed: %v", p.Name, derr)
	}
	if w := wakeNote("", restoreWake(ctx, f.Bucket(), host)); w != "" {
		left += "; " + w
	}
	return fmt.Errorf("%w; the space is served by this fleet, as before%s", failed, left)
}

// Reclaim moves host's space back from its provider (c connects to it).
func Reclaim(ctx context.Context, f Fleet, c *Conn, host string, lim Limits) (Moved, error) {
	p := c.P
	res := Moved{Host: host, Provider: p.Name}
	rt, err := moveRoute(f, host)
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
		// Half-way out: the provider never served it (what it got is held), the state
		// here is current.
		if _, err := f.SetDelegation(ctx, host, "", ""); err != nil {
			return res, err
		}
		werr := restoreWake(ctx, f.Bucket(), host)
		if err := c.Delete(ctx, host); err != nil {
			res.Note = fmt.Sprintf("the provider may still list %s, held asleep and serving nobody (its delete failed: %v)", host, err)
		}
		res.Note = wakeNote(res.Note, werr)
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
	// held: the provider may hold the space asleep (its hibernate reached it).
	held := true
	// The route goes back first: while it is moving no box forwards the space, so the
	// provider serves no one until its route names it again.
	undo := func(step string, err error) (Moved, error) {
		ctx := context.WithoutCancel(ctx)
		if _, uerr := f.SetDelegation(ctx, host, p.Name, ""); uerr != nil {
			return res, moveErr(ErrMoveUpstream, "reclaiming %s from %s failed %s: %v; and putting it back failed: %v; it is served by neither side until reclaim is run again", host, p.Name, step, err, uerr)
		}
		if held {
			if _, rerr := c.Resume(ctx, host); rerr != nil {
				holds := "holds it asleep"
				if step == stepHibernate {
					holds = "serves it unless its hibernate took effect: then it holds it asleep"
				}
				return res, moveErr(ErrMoveUpstream, "reclaiming %s from %s failed %s: %v; and asking %s to serve it again failed: %v; the route names %s, which %s, served by neither side until reclaim or delegate is run again", host, p.Name, step, err, p.Name, rerr, p.Name, holds)
			}
		}
		return res, moveErr(ErrMoveUpstream, "reclaiming %s from %s failed %s: %v; the space is served by %s, as before", host, p.Name, step, err, p.Name)
	}
	if _, err := c.Hibernate(ctx, host); err != nil {
		held = !Unsent(err)
		return undo(stepHibernate, err)
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
	// The next scheduled wake, recorded before the flip (kept through it unless due,
	// as when the box dies before it records it again) and after it (one due meanwhile
	// was dropped, the space not this fleet's to run yet).
	restoreWake(ctx, f.Bucket(), host)
	if err := setDelegation(ctx, f, host, "", ""); err != nil {
		return undo("flipping its route", err)
	}
	werr := restoreWake(ctx, f.Bucket(), host)
	if err := c.Delete(ctx, host); err != nil {
		res.Note = fmt.Sprintf("the provider still lists %s, held asleep and serving nobody (its delete failed: %v)", host, err)
	}
	res.Note = wakeNote(res.Note, werr)
	return res, nil
}

// stepHibernate names a reclaim's hibernate in its errors.
const stepHibernate = "putting it to sleep at the provider"

// wakeNote adds to note what a move says of a scheduled wake it could not record (err).
func wakeNote(note string, err error) string {
	if err == nil {
		return note
	}
	s := fmt.Sprintf("its next scheduled wake is not recorded (%v): it wakes at its next request", err)
	if note == "" {
		return s
	}
	return note + "; " + s
}
