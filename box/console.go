package box

import (
	"context"
	"fmt"
	"time"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/spacestore"
)

// Console is what the operator's console reads (fleetview.Source) and, when its actions
// are on, does (fleetview.Actions), over one box. The value stays equal as long as the box
// does, across config reloads, so the console keeps its history. Its actions are the
// box's own methods, the ones the admin API calls, acting with the settings of the
// running config.
type Console struct{ b *Box }

// Console returns the box's console source.
func (b *Box) Console() Console { return Console{b} }

// Fleet reads every live box (Box.Fleet).
func (c Console) Fleet(ctx context.Context) (fleetview.Fleet, error) { return c.b.Fleet(ctx), nil }

// Spaces lists the routes whose host matches search, with this box's engine state.
func (c Console) Spaces(ctx context.Context, search string, limit int) ([]fleetview.Space, error) {
	byHost := map[string]engine.SpaceStatus{}
	for _, s := range c.b.eng.Status() {
		byHost[s.Host] = s
	}
	conns := c.b.SpaceConns()
	var out []fleetview.Space
	after := ""
	for {
		rts, next, err := c.b.reg.List(after, 1000)
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
				sp.Durability = string(st.Durability)
				if l := st.Log; l != nil {
					sp.Log = &fleetview.Log{Segments: l.Segments, Waiting: l.Waiting, Lag: l.Lag, WaitP50: l.WaitP50, WaitP99: l.WaitP99, Failed: l.Failed}
				}
			}
			if n, ok := conns[rt.Host]; ok {
				sp.Conns = &n
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
func (c Console) Stored(ctx context.Context, host string) (fleetview.Stored, bool, error) {
	m, _, err := spacestore.ReadManifest(ctx, c.b.bucket, host)
	if err != nil || m == nil {
		return fleetview.Stored{}, false, err
	}
	st := fleetview.Stored{Generation: m.Generation, Files: len(m.Files), WrittenBy: m.WrittenBy, WrittenAt: m.WrittenAt}
	if c.b.mesh == nil && m.WrittenBy == c.b.cfg.Holder {
		// Without the mesh a manifest names its writer by the box's lease holder id; the
		// fleet names this box by its host name.
		st.WrittenBy = c.b.name()
	}
	if m.NextWake != nil {
		st.NextWake = *m.NextWake
	}
	for _, f := range m.Files {
		st.Size += f.Size
	}
	return st, true, nil
}

// Stats reads this box's totals.
func (c Console) Stats() fleetview.Stats {
	st := fleetview.Stats{Awake: len(c.b.awake()), Requests: c.b.requests.Load(), BucketRequests: c.b.bucket.Requests()}
	for _, n := range c.b.SpaceConns() {
		st.Held += n.Open + n.Streams
	}
	return st
}

// Subscribe relays the engine's events.
func (c Console) Subscribe(f func(fleetview.Event)) func() {
	box := ""
	if c.b.mesh != nil {
		box = c.b.mesh.cfg.Self
	}
	return c.b.eng.Observe(func(ev engine.Event) {
		out := fleetview.Event{At: ev.At, Type: ev.Type, Host: ev.Host, Detail: ev.Reason, Err: ev.Err}
		switch ev.Type {
		case engine.EventWake:
			out.Phases = &fleetview.Phases{Lease: ev.Phases.Lease, Restore: ev.Phases.Restore, Fence: ev.Phases.Fence, Start: ev.Phases.Start, Ready: ev.Phases.Ready}
		case engine.EventCheckpoint:
			if ev.Err == "" && ev.Bytes == 0 {
				// Nothing changed since the last one: a periodic checkpoint of an idle
				// space would drown the events that matter (the engine's event still
				// reaches the metrics: lchat_checkpoint_seconds counts it).
				return
			}
			out.Detail = fmt.Sprintf("%s, %d bytes uploaded, %d bytes in all", ev.Duration.Round(time.Millisecond), ev.Bytes, ev.Size)
		case engine.EventFence:
			if ev.Host == "" {
				out.Box = box
			}
		}
		f(out)
	})
}

// Hibernate puts the space to sleep on this box now (Box.SleepNow).
func (c Console) Hibernate(ctx context.Context, host string) error { return c.b.SleepNow(ctx, host) }

// Relocate moves a hibernating space to another region (Box.Relocate), as the admin API
// does.
func (c Console) Relocate(ctx context.Context, host, region string, moveDNS bool) error {
	_, err := c.b.Relocate(ctx, mesh.RelocateRequest{Host: host, To: region, MoveDNS: moveDNS})
	return err
}

// Remove deletes the route, saving its space first (Box.Remove), as the admin API does.
func (c Console) Remove(ctx context.Context, host string) error { return c.b.Remove(ctx, host, false) }

// Interface guards
var (
	_ fleetview.Source  = Console{}
	_ fleetview.Actions = Console{}
)
