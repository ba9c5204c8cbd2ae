package box

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/sandbox"
)

// HeldConnBytes is what one connection the box holds (a WebSocket or event stream of
// package held, parked between messages) is counted as in its warm set: its socket, TLS
// state and buffers, beside the bytes it queues (PendingBytes, OutBytes), which are counted
// as they are.
const HeldConnBytes = 32 << 10

// Budget reserve: a box's default budget for spaces is its memory (sandbox.BoxMemory) less
// the larger of budgetReserveMin and budgetReserveShare of it, for the box itself, the
// kernel and the page cache.
const (
	budgetReserveMin   = 512 << 20
	budgetReserveShare = 0.10
)

// DefaultBudget is the memory budget of a box that configures none: its memory less the
// reserve; 0 (no budget) when its memory cannot be read.
func DefaultBudget() int64 {
	total, err := sandbox.BoxMemory()
	if err != nil {
		return 0
	}
	return max(total-max(budgetReserveMin, int64(float64(total)*budgetReserveShare)), 0)
}

// HeldCost is what the connections a box holds cost it, from their counts: held (open
// sockets) and streams at HeldConnBytes each, plus the bytes they queue.
func HeldCost(held, streams, pending, out int64) int64 {
	return (held+streams)*HeldConnBytes + pending + out
}

// memory measures this box's warm set for its heartbeat (mesh.MembershipConfig.Load) and
// the metrics: the memory of each awake space, read once per beat, and what the
// connections it holds cost. It remembers each awake space's peak of its current wake and,
// when the space is no longer awake at a beat, writes that peak as its size record
// (mesh.Sizes.Save), which bounded-load placement reads on any box when the space wakes
// next.
type memory struct {
	budget int64
	sizes  *mesh.Sizes
	logger *zap.Logger
	ctx    context.Context
	// eng is set once the engine exists (Open), before the first beat.
	eng atomic.Pointer[engine.Engine]
	// held, when set (Box.SetHeldCost), is what the held connections cost.
	held atomic.Pointer[func() int64]

	// mu guards the fields below; measure is their writer (the membership's beats, one
	// at a time, and the metrics of a box without the mesh).
	mu sync.Mutex
	// peak is each awake space's largest reading in its current wake.
	peak map[string]int64
	last mesh.Load
	took time.Duration
}

// measure reads the box's load now.
func (mm *memory) measure() mesh.Load {
	start := time.Now()
	var spaces []engine.SpaceMemory
	if eng := mm.eng.Load(); eng != nil {
		spaces = eng.Memory()
	}
	var held int64
	if f := mm.held.Load(); f != nil {
		held = (*f)()
	}
	mm.mu.Lock()
	if mm.peak == nil {
		mm.peak = map[string]int64{}
	}
	awake := make(map[string]bool, len(spaces))
	warm := held
	for _, s := range spaces {
		warm += s.Bytes
		awake[s.Host] = true
		mm.peak[s.Host] = max(mm.peak[s.Host], s.Bytes)
		if mm.sizes != nil {
			mm.sizes.Note(s.Host, mm.peak[s.Host])
		}
	}
	type slept struct {
		host  string
		bytes int64
	}
	var gone []slept
	for h, p := range mm.peak {
		if !awake[h] {
			gone = append(gone, slept{h, p})
			delete(mm.peak, h)
		}
	}
	mm.last = mesh.Load{WarmSet: warm, Budget: mm.budget, Awake: len(spaces)}
	mm.took = time.Since(start)
	last := mm.last
	mm.mu.Unlock()
	if mm.sizes != nil && mm.ctx != nil {
		for _, s := range gone {
			safego.Go(nil, mm.logger, "space size record", func() {
				ctx, cancel := context.WithTimeout(mm.ctx, 30*time.Second)
				defer cancel()
				if err := mm.sizes.Save(ctx, s.host, s.bytes); err != nil && mm.ctx.Err() == nil {
					mm.logger.Warn("writing a space's size", zap.String("host", s.host), zap.Error(err))
				}
			})
		}
	}
	return last
}

// lastMeasured is the load as of the last measure, and how long that reading took.
func (mm *memory) lastMeasured() (mesh.Load, time.Duration) {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	return mm.last, mm.took
}

// Capacity is this box's memory and the fleet's, as the metrics and the fleet view show
// them.
type Capacity struct {
	// WarmSet is this box's warm set as last measured; Budget its budget; Awake its
	// awake spaces.
	mesh.Load
	// ReadTook is how long the last reading of the awake spaces' memory took.
	ReadTook time.Duration
	// Fleet is the fleet's memory and desired box count, from this box's last listing
	// (this box alone without the mesh).
	Fleet mesh.Fleet
	// Autoscale is what the desired count was computed with.
	Autoscale mesh.Autoscale
}

// Capacity reads this box's memory and the fleet's. Without the mesh it measures the box
// now (there is no beat) and the fleet is the box alone.
func (b *Box) Capacity() Capacity {
	as := b.cfg.MeshOptions.Autoscale.WithDefaults()
	if b.mesh == nil {
		mm := &memory{budget: budgetOf(b.cfg.MeshOptions)}
		mm.eng.Store(b.eng)
		l := mm.measure()
		_, took := mm.lastMeasured()
		return Capacity{Load: l, ReadTook: took, Autoscale: as,
			Fleet: mesh.FleetOf([]mesh.Member{{Self: b.name(), Load: l}}, as)}
	}
	l, took := b.mesh.mem.lastMeasured()
	return Capacity{Load: l, ReadTook: took, Autoscale: as, Fleet: mesh.FleetOf(b.mesh.m.Live(), as)}
}

// SetHeldCost sets what the connections this box holds cost it (modules/lchat, from its
// held.Conns: HeldCost of their counts), counted in its warm set from the next beat.
func (b *Box) SetHeldCost(f func() int64) {
	if b.mesh != nil {
		b.mesh.mem.held.Store(&f)
	}
}

// budgetOf is the memory budget opts configure, or the box's default (DefaultBudget).
func budgetOf(opts MeshOptions) int64 {
	if opts.MemoryBudget > 0 {
		return opts.MemoryBudget
	}
	return DefaultBudget()
}

// balanceOf is bounded-load placement's ε opts configure: mesh.DefaultBalance for 0,
// none (plain HRW) for a negative value.
func balanceOf(opts MeshOptions) float64 {
	switch {
	case opts.Balance < 0:
		return 0
	case opts.Balance == 0:
		return mesh.DefaultBalance
	}
	return opts.Balance
}
