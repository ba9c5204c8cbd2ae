package box

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/internal/safego"
	"github.com/lchat/lchat-caddy/lifecycle"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"
)

// MeshOptions tune the mesh; zero values take the defaults of mesh.MembershipConfig.
type MeshOptions struct {
	Beat, DeadAfter, FenceMargin time.Duration
	// TrustedCAFiles are PEM files of roots trusted, besides the system roots, for peers'
	// certificates (forwarded requests and the peer API).
	TrustedCAFiles []string
	// ForwardTimeout bounds dialing and the TLS handshake to a peer. Default 5s.
	ForwardTimeout time.Duration
	// ResyncInterval is the catch-up's rotation interval (mesh.CatchUp). Default 1m.
	ResyncInterval time.Duration
	// PublicAddress is this box's public IP, advertised in its heartbeat.
	PublicAddress string
	// TestClockOffset shifts this box's wall clock as the mesh sees it. Test-only: tests
	// that run boxes whose clocks disagree set it (tests/meshe2e); never set on a real box.
	TestClockOffset time.Duration
	// MemoryBudget is the bytes this box has for spaces, published in its heartbeat.
	// Default: its memory less a reserve (DefaultBudget).
	MemoryBudget int64
	// Balance is bounded-load placement's ε (mesh.Node.Balance): 0 is
	// mesh.DefaultBalance, a negative value plain HRW.
	Balance float64
	// Autoscale is how the fleet's desired box count is computed (mesh.FleetOf).
	Autoscale mesh.Autoscale
}

// Mesh is this box's running mesh: identity, membership, placement, replication, the peer
// client and counters.
type Mesh struct {
	cfg     mesh.Config
	m       *mesh.Membership
	mem     *memory
	node    *mesh.Node
	repl    *mesh.Replicator
	catchUp *mesh.CatchUp
	client  *mesh.Client
	marker  mesh.Marker
	roots   *x509.CertPool
	timeout time.Duration
	version string
	logger  *zap.Logger

	// ctx is the mesh's own context: fan-outs and the membership loop end on it.
	ctx    context.Context
	cancel context.CancelFunc

	// C are the mesh's counters; the handler and the peer API count into them.
	C Counters
}

// Counters only grow; they are read by the status endpoints and the metrics.
type Counters struct {
	Forwards        atomic.Uint64 // requests this box proxied to a peer
	ForwardErrors   atomic.Uint64 // forwards that failed (peer unreachable, TLS, ...)
	ForwardFallback atomic.Uint64 // forwards that failed to dial and were served here
	ForwardedIn     atomic.Uint64 // requests that arrived validly marked by a peer
	MarkersStripped atomic.Uint64 // invalid markers removed from outside traffic
	HolderForwards  atomic.Uint64 // forwards to a lease holder after a lease conflict
	LeaseBusy       atomic.Uint64 // 503s because the holder was already forwarded to
	LivesAtLoops    atomic.Uint64 // 503s: a forwarded request for a route living elsewhere
	RowsIn          atomic.Uint64 // rows replicated in from peers
	RowsRejected    atomic.Uint64 // peer rows refused (malformed, out of scope, kind)
	TombstonesIn    atomic.Uint64 // tombstones applied from peers
	RowsStale       atomic.Uint64 // peer rows and tombstones older than what is held here
}

// Counters returns the mesh's counters by name: this box's, its fan-outs' and its
// catch-ups'.
func (ms *Mesh) Counters() map[string]uint64 {
	c := &ms.C
	fanouts, fanoutErrors := ms.repl.Counts()
	cu := ms.catchUp.Stats()
	return map[string]uint64{
		"forwards":         c.Forwards.Load(),
		"forward_errors":   c.ForwardErrors.Load(),
		"forward_fallback": c.ForwardFallback.Load(),
		"forwarded_in":     c.ForwardedIn.Load(),
		"markers_stripped": c.MarkersStripped.Load(),
		"holder_forwards":  c.HolderForwards.Load(),
		"lease_busy":       c.LeaseBusy.Load(),
		"lives_at_loops":   c.LivesAtLoops.Load(),
		"rows_in":          c.RowsIn.Load(),
		"rows_rejected":    c.RowsRejected.Load(),
		"tombstones_in":    c.TombstonesIn.Load(),
		"rows_stale":       c.RowsStale.Load(),
		"fanouts":          fanouts,
		"fanout_errors":    fanoutErrors,
		"catch_ups":        cu.Runs,
		"catch_up_rows":    cu.Puts,
		"catch_up_tombs":   cu.Tombstones,
		"catch_up_errors":  cu.Failures,
	}
}

// Config is the mesh identity.
func (ms *Mesh) Config() mesh.Config { return ms.cfg }

// Membership is the mesh membership.
func (ms *Mesh) Membership() *mesh.Membership { return ms.m }

// Box is this box's place in the mesh (placement, acceptance of rows).
func (ms *Mesh) Node() *mesh.Node { return ms.node }

// Client is the peer API's client (the mesh token, the peers' trusted roots).
func (ms *Mesh) Client() *mesh.Client { return ms.client }

// Incarnation names this box's process in the mesh (its heartbeat's incarnation).
func (ms *Mesh) Incarnation() string { return ms.m.Config().Incarnation }

// Marker signs and checks forwarded requests.
func (ms *Mesh) Marker() mesh.Marker { return ms.marker }

// peerTimeout bounds a peer API call: a peer answers a row or tombstone once it has
// carried it out (saved and stopped the space it takes off its box, up to saveTimeout),
// so the sender waits that long before it counts the call failed and retries.
const peerTimeout = saveTimeout + 15*time.Second

// newMesh builds (but does not start) the mesh for this box.
func newMesh(cfg mesh.Config, opts MeshOptions, bkt bucket.Bucket, version string, life *lifecycle.Machine, logger *zap.Logger) (*Mesh, error) {
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	for _, f := range opts.TrustedCAFiles {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("mesh.trusted_ca_files: %v", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("mesh.trusted_ca_files: %s holds no PEM certificate", f)
		}
	}
	timeout := opts.ForwardTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ms := &Mesh{
		cfg:     cfg,
		marker:  mesh.Marker{Token: cfg.Token, Accept: cfg.Accept},
		roots:   roots,
		timeout: timeout,
		version: version,
		logger:  logger,
	}
	ms.ctx, ms.cancel = context.WithCancel(context.Background())
	sizes := &mesh.Sizes{Bucket: bkt, Self: cfg.Self}
	ms.mem = &memory{budget: budgetOf(opts), sizes: sizes, logger: logger.Named("memory"), ctx: ms.ctx}
	ms.client = &mesh.Client{
		Token: cfg.Token,
		HTTPClient: &http.Client{
			Timeout: peerTimeout,
			Transport: &http.Transport{
				// Never through an environment proxy, like forwards: the request carries
				// the mesh token, and over an http SELF a proxy would read it.
				Proxy:               nil,
				DialContext:         (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
				TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
				TLSHandshakeTimeout: timeout,
				MaxIdleConnsPerHost: 4,
				IdleConnTimeout:     90 * time.Second,
			},
		},
		Logger: logger.Named("replication"),
	}
	var wall func() time.Time
	if d := opts.TestClockOffset; d != 0 {
		logger.Warn("test-only clock offset in effect", zap.Duration("offset", d))
		wall = func() time.Time { return time.Now().Add(d) }
	}
	ms.m, err = mesh.NewMembership(bkt, mesh.MembershipConfig{
		Self:        cfg.Self,
		Region:      cfg.Region,
		Domains:     cfg.Domains,
		Version:     version,
		Address:     opts.PublicAddress,
		Bucket:      bkt.String(),
		Beat:        opts.Beat,
		DeadAfter:   opts.DeadAfter,
		FenceMargin: opts.FenceMargin,
		Lifecycle:   life,
		Logger:      logger.Named("membership"),
		WallClock:   wall,
		Load:        ms.mem.measure,
	})
	if err != nil {
		ms.cancel()
		return nil, err
	}
	// Markers are signed and checked against the bucket's clock, not this box's wall
	// clock: boxes whose clocks disagree still recognize each other's (mesh/clock.go).
	ms.marker.Now = ms.m.BucketNow
	// Bounded loads keep a space on the box it last woke on while that box has room.
	ms.m.Placement().Last = sizes.Box
	ms.node = &mesh.Node{Self: cfg.Self, Domains: cfg.Domains, Region: cfg.Region, Live: ms.m.Live, IsDraining: ms.m.Draining,
		Holders: new(mesh.Holders), Placement: ms.m.Placement(), Balance: balanceOf(opts), Sizes: sizes}
	ms.repl = &mesh.Replicator{Node: ms.node, Client: ms.client, Ctx: ms.ctx}
	ms.catchUp = &mesh.CatchUp{Node: ms.node, Peer: ms.client, Resync: opts.ResyncInterval,
		Logger: logger.Named("replication")}
	return ms, nil
}

// engineConfig points the engine's lease identity and liveness at the mesh: leases
// carry this box's SELF and incarnation, a lease is held while its holder's heartbeat
// is live, and a host's due scheduled wake fires where it would wake (mesh.Node.FiresWake).
func (ms *Mesh) engineConfig(cfg *engine.Config, reg *registry.Registry) {
	mc := ms.m.Config()
	cfg.Holder = ms.cfg.Self
	cfg.Incarnation = mc.Incarnation
	cfg.HolderLive = ms.m.HolderLive
	cfg.Fresh = ms.m.Fresh
	// A fenced box's instances must be gone well before peers count it dead.
	cfg.FenceStopGrace = mc.FenceMargin / 2
	cfg.Owns = func(host string, late time.Duration) bool { return ms.node.FiresWakeRoute(reg.Lookup, host, late) }
}

// start starts the loop (the box's lifecycle stays fenced until its first good
// heartbeat) and the catch-up.
func (ms *Mesh) start(eng *engine.Engine, reg *registry.Registry) error {
	ms.mem.eng.Store(eng)
	if err := ms.m.Start(ms.ctx); err != nil {
		return err
	}
	ms.catchUp.Rows = func() ([]mesh.RouteRow, error) { return ms.node.Rows(reg) }
	ms.catchUp.Tombs = reg.Tombstones
	safego.Go(nil, ms.logger, "mesh catch-up", func() { ms.catchUp.Run(ms.ctx) })
	// The members' addresses, refused to spaces under network egress.
	safego.Go(nil, ms.logger, "mesh peer addresses", func() {
		mesh.WatchPeerAddrs(ms.ctx, ms.m, ms.m.Config().Beat, nil, eng.SetNetworkPeers)
	})
	return nil
}

// markDraining is the first step of a real shutdown: the heartbeat is rewritten as
// draining. A failure is logged and the drain goes on: the loop keeps trying, and
// fencing still guards the writes.
func (ms *Mesh) markDraining() {
	ms.shutdownStep(ms.m.Config().OpTimeout+time.Second, ms.m.MarkDraining,
		"marking this box draining in the mesh", "draining: heartbeat marked, peers stop placing spaces here")
}

// leave is the last step of a real shutdown, after the drain: stop beating and delete
// the heartbeat.
func (ms *Mesh) leave() {
	ms.shutdownStep(10*time.Second, ms.m.Leave, "leaving the mesh", "left the mesh: heartbeat deleted")
}

// shutdownStep runs one membership step of a shutdown within timeout and logs how it went.
func (ms *Mesh) shutdownStep(timeout time.Duration, step func(context.Context) error, failed, done string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	if err := step(ctx); err != nil {
		ms.logger.Error(failed, zap.Error(err))
		return
	}
	ms.logger.Info(done, zap.Duration("took", time.Since(start)))
}

// close ends the membership and the fan-outs still running.
func (ms *Mesh) close() {
	ms.m.Close()
	ms.cancel()
}

// fanout replicates a created or changed row to the peers, in the background.
func (b *Box) fanout(rt registry.Route) {
	if b.mesh != nil {
		b.mesh.repl.Put(rt)
	}
}

// fanoutTombstone fans a deletion out like fanout, with the tombstone's revision.
func (b *Box) fanoutTombstone(host, homeRegion string) {
	if b.mesh != nil {
		rev, _ := b.reg.TombstoneRev(host)
		b.mesh.repl.Delete(host, homeRegion, rev)
	}
}
