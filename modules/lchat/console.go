package lchat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/space"
)

// FleetView is what the console (http.handlers.lchat_console) reads. The value wraps the
// state that outlives reloads, so it stays equal across them and the console keeps its
// history.
func (a *App) FleetView() fleetview.Source { return consoleSource{s: a.shared} }

// consoleSource implements fleetview.Source (and fleetview.Actions) over one box's state.
type consoleSource struct{ s *shared }

// app is the newest config's app over this state, for the actions (they check routes
// against its kinds).
func (c consoleSource) app() (*App, error) {
	a := current.Load()
	if a == nil || a.shared != c.s {
		return nil, errors.New("the lchat config is being replaced; try again")
	}
	return a, nil
}

// Fleet reads every live box: this one from memory, peers through their status endpoint.
func (c consoleSource) Fleet(ctx context.Context) (fleetview.Fleet, error) {
	awake := awakeHosts(c.s.eng)
	ms := c.s.mesh
	if ms == nil {
		host, _ := os.Hostname()
		return fleetview.Fleet{Self: host, Boxes: []fleetview.Box{{
			Self: host, This: true, Awake: awake, Version: caddyVersion(), Counters: engineCounters(c.s.eng),
		}}}, nil
	}
	live := ms.m.Live()
	f := fleetview.Fleet{Self: ms.cfg.Self, Mesh: true, Boxes: make([]fleetview.Box, len(live))}
	var wg sync.WaitGroup
	for i, m := range live {
		b := &f.Boxes[i]
		b.Self, b.Region, b.Version, b.HeartbeatAge, b.Draining = m.Self, m.Region, m.Version, m.Age, m.Draining
		if m.Self == ms.cfg.Self {
			b.This, b.Fenced, b.Draining, b.Awake = true, ms.m.Fenced(), ms.m.Draining(), awake
			b.Counters = ms.counters()
			for k, v := range engineCounters(c.s.eng) {
				b.Counters[k] = v
			}
			continue
		}
		safego.Go(&wg, c.s.logger, "console fleet read", func() {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			raw, err := ms.client.Status(rctx, m.Self)
			if err != nil {
				b.Error = err.Error()
				return
			}
			var st MeshStatus
			if err := json.Unmarshal(raw, &st); err != nil {
				b.Error = fmt.Sprintf("decoding status: %v", err)
				return
			}
			b.Fenced, b.Awake, b.Counters = st.Fenced, st.Awake, st.Counters
		})
	}
	wg.Wait()
	return f, nil
}

// Spaces lists the routes whose host matches search, with this box's engine state.
func (c consoleSource) Spaces(ctx context.Context, search string, limit int) ([]fleetview.Space, error) {
	byHost := map[string]engine.SpaceStatus{}
	for _, s := range c.s.eng.Status() {
		byHost[s.Host] = s
	}
	var out []fleetview.Space
	after := ""
	for {
		rts, next, err := c.s.reg.List(after, 1000)
		if err != nil {
			return out, err
		}
		for _, rt := range rts {
			if !fleetview.Match(rt.Host, search) {
				continue
			}
			sp := fleetview.Space{Host: rt.Host, Kind: rt.Kind, Hibernate: rt.Hibernate, HomeRegion: rt.HomeRegion}
			if st, ok := byHost[rt.Host]; ok {
				sp.State, sp.Since, sp.LastSync, sp.LastSyncError, sp.Size = string(st.State), st.Since, st.LastSync, st.LastSyncError, st.Size
			}
			out = append(out, sp)
			if limit > 0 && len(out) >= limit {
				return out, nil
			}
		}
		if next == "" || ctx.Err() != nil {
			return out, ctx.Err()
		}
		after = next
	}
}

// Stored reads host's manifest from the bucket.
func (c consoleSource) Stored(ctx context.Context, host string) (fleetview.Stored, bool, error) {
	m, _, err := space.ReadManifest(ctx, c.s.bucket, host)
	if err != nil || m == nil {
		return fleetview.Stored{}, false, err
	}
	st := fleetview.Stored{Generation: m.Generation, Files: len(m.Files), WrittenBy: m.WrittenBy, WrittenAt: m.WrittenAt}
	if m.NextWake != nil {
		st.NextWake = *m.NextWake
	}
	for _, f := range m.Files {
		st.Size += f.Size
	}
	return st, true, nil
}

// Stats reads this box's totals.
func (c consoleSource) Stats() fleetview.Stats {
	return fleetview.Stats{Awake: len(awakeHosts(c.s.eng)), Requests: c.s.requests.Load(), BucketRequests: c.s.counted.Requests()}
}

// Subscribe relays the engine's events.
func (c consoleSource) Subscribe(f func(fleetview.Event)) func() {
	box := ""
	if c.s.mesh != nil {
		box = c.s.mesh.cfg.Self
	}
	return c.s.eng.Observe(func(ev engine.Event) {
		out := fleetview.Event{At: ev.At, Type: ev.Type, Host: ev.Host, Detail: ev.Reason, Err: ev.Err}
		switch ev.Type {
		case engine.EventWake:
			out.Phases = &fleetview.Phases{Lease: ev.Phases.Lease, Restore: ev.Phases.Restore, Fence: ev.Phases.Fence, Start: ev.Phases.Start, Ready: ev.Phases.Ready}
		case engine.EventCheckpoint:
			out.Detail = fmt.Sprintf("%s, %d bytes uploaded, %d bytes in all", ev.Duration.Round(time.Millisecond), ev.Bytes, ev.Size)
		case engine.EventFence:
			if ev.Host == "" {
				out.Box = box
			}
		}
		f(out)
	})
}

// Hibernate puts the space to sleep on this box now: stop, checkpoint, release.
func (c consoleSource) Hibernate(ctx context.Context, host string) error {
	if _, err := c.s.reg.Get(host); errors.Is(err, registry.ErrNotFound) {
		return fmt.Errorf("no route for host %s", host)
	}
	here := slices.Contains(awakeHosts(c.s.eng), host)
	if !here {
		return fmt.Errorf("%s is not awake on this box", host)
	}
	return c.s.eng.Sleep(ctx, host)
}

// Relocate moves a hibernating space to another region, as the admin API does.
func (c consoleSource) Relocate(ctx context.Context, host, region string, moveDNS bool) error {
	a, err := c.app()
	if err != nil {
		return err
	}
	ms := c.s.mesh
	if ms == nil {
		return errMeshOff
	}
	if _, err := a.relocator(ms).Relocate(ctx, mesh.RelocateRequest{Host: host, To: region, MoveDNS: moveDNS}); err != nil {
		return errors.New(mesh.RelocateErrorMessage(err))
	}
	return nil
}

// Remove deletes the route, as the admin API does (the row, a tombstone to peers, the
// space's local state; its bucket data stays).
func (c consoleSource) Remove(ctx context.Context, host string) error {
	a, err := c.app()
	if err != nil {
		return err
	}
	if err := a.removeRoute(ctx, host, false); errors.Is(err, registry.ErrNotFound) {
		return fmt.Errorf("no route for host %s", host)
	} else if err != nil {
		return err
	}
	return nil
}

func awakeHosts(eng *engine.Engine) []string {
	out := []string{}
	for _, s := range eng.Status() {
		if s.State == engine.StateAwake {
			out = append(out, s.Host)
		}
	}
	return out
}

func engineCounters(eng *engine.Engine) map[string]uint64 {
	ec := eng.Counters()
	return map[string]uint64{"wakes": ec.Wakes, "sleeps": ec.Sleeps, "crashes": ec.Crashes,
		"lease_conflicts": ec.LeaseConflicts, "fenced": ec.Fenced, "syncs": ec.Syncs}
}

func caddyVersion() string {
	v, _ := caddy.Version()
	return v
}

// Interface guards
var (
	_ fleetview.Source  = consoleSource{}
	_ fleetview.Actions = consoleSource{}
)
