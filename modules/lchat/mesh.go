package lchat

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/registry"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// MeshOptions tunes the mesh of the lchat app. The mesh itself is switched on and
// identified by the environment (LCHAT_MESH_SELF, LCHAT_MESH_DOMAINS,
// LCHAT_MESH_TOKEN, LCHAT_MESH_REGION): without LCHAT_MESH_SELF none of this runs.
type MeshOptions struct {
	// Beat is the heartbeat interval. Default 15s.
	Beat caddy.Duration `json:"beat,omitempty"`
	// DeadAfter is the heartbeat age after which a box counts as dead. Default 45s.
	DeadAfter caddy.Duration `json:"dead_after,omitempty"`
	// FenceMargin is how long before DeadAfter a box whose heartbeat writes fail
	// fences itself. Default DeadAfter/3.
	FenceMargin caddy.Duration `json:"fence_margin,omitempty"`
	// TrustedCAFiles are PEM files of roots trusted, besides the system roots, for
	// peers' certificates (forwarded requests and the peer API). Default: none.
	TrustedCAFiles []string `json:"trusted_ca_files,omitempty"`
	// ForwardTimeout bounds dialing and the TLS handshake to a peer. Default 5s.
	ForwardTimeout caddy.Duration `json:"forward_timeout,omitempty"`
	// ResyncInterval is how often this box catches one live peer, in rotation, up on the
	// route changes the peer lacks (mesh.CatchUp); a peer that comes up is caught up at
	// once. Default 1m.
	ResyncInterval caddy.Duration `json:"resync_interval,omitempty"`
	// PublicAddress is this box's public IP, advertised in its heartbeat: the address
	// `relocate --move-dns` points a space's A record at when it moves to this box's
	// region. Default: none (the box is never a DNS target).
	PublicAddress string `json:"public_address,omitempty"`
	// RelocateDNS is the DNS provider `relocate --move-dns` repoints records through.
	// Default: none (--move-dns fails before changing anything).
	RelocateDNS *RelocateDNS `json:"relocate_dns,omitempty"`
	// RegionBucketsRaw are the buckets of other regions, by region, for relocating a
	// space to a region whose boxes keep spaces in another bucket than this box.
	// Default: none (every destination must share this box's bucket).
	RegionBucketsRaw map[string]json.RawMessage `json:"region_buckets,omitempty" caddy:"namespace=lchat.buckets inline_key=backend"`
}

// meshState is this box's running mesh: identity, membership, the peer client and
// counters. It lives in the shared (usage-pooled) state, so a reload keeps it.
type meshState struct {
	cfg     mesh.Config
	m       *mesh.Membership
	box     *mesh.Box
	repl    *mesh.Replicator
	catchUp *mesh.CatchUp
	client  *mesh.Client
	marker  mesh.Marker
	roots   *x509.CertPool
	timeout time.Duration
	version string
	logger  *zap.Logger

	// eng receives fence decisions; set once by start, before the membership runs.
	eng atomic.Pointer[engine.Engine]

	// ctx is the mesh's own context: fan-outs and the membership loop end on it.
	ctx    context.Context
	cancel context.CancelFunc

	c meshCounters
}

// meshCounters only grow; they are read by the status endpoints and the metrics.
type meshCounters struct {
	forwards        atomic.Uint64 // requests this box proxied to a peer
	forwardErrors   atomic.Uint64 // forwards that failed (peer unreachable, TLS, ...)
	forwardFallback atomic.Uint64 // forwards that failed to dial and were served here
	forwardedIn     atomic.Uint64 // requests that arrived validly marked by a peer
	markersStripped atomic.Uint64 // invalid markers removed from outside traffic
	holderForwards  atomic.Uint64 // forwards to a lease holder after a lease conflict
	leaseBusy       atomic.Uint64 // 503s because the holder was already forwarded to
	livesAtLoops    atomic.Uint64 // 503s: a forwarded request for a route living elsewhere
	rowsIn          atomic.Uint64 // rows replicated in from peers
	rowsRejected    atomic.Uint64 // peer rows refused (malformed, out of scope, kind)
	tombstonesIn    atomic.Uint64 // tombstones applied from peers
	rowsStale       atomic.Uint64 // peer rows and tombstones older than what is held here
}

func (ms *meshState) counters() map[string]uint64 {
	c := &ms.c
	fanouts, fanoutErrors := ms.repl.Counts()
	cu := ms.catchUp.Stats()
	return map[string]uint64{
		"forwards":         c.forwards.Load(),
		"forward_errors":   c.forwardErrors.Load(),
		"forward_fallback": c.forwardFallback.Load(),
		"forwarded_in":     c.forwardedIn.Load(),
		"markers_stripped": c.markersStripped.Load(),
		"holder_forwards":  c.holderForwards.Load(),
		"lease_busy":       c.leaseBusy.Load(),
		"lives_at_loops":   c.livesAtLoops.Load(),
		"rows_in":          c.rowsIn.Load(),
		"rows_rejected":    c.rowsRejected.Load(),
		"tombstones_in":    c.tombstonesIn.Load(),
		"rows_stale":       c.rowsStale.Load(),
		"fanouts":          fanouts,
		"fanout_errors":    fanoutErrors,
		"catch_ups":        cu.Runs,
		"catch_up_rows":    cu.Puts,
		"catch_up_tombs":   cu.Tombstones,
		"catch_up_errors":  cu.Failures,
	}
}

// parseMeshEnv reads the mesh identity from the environment. Errors name the
// variable and never carry the token.
func parseMeshEnv() (mesh.Config, error) {
	cfg, err := mesh.ParseEnv(os.Getenv)
	if err != nil {
		return mesh.Config{}, fmt.Errorf("mesh configuration: %v", err)
	}
	return cfg, nil
}

// newMeshState builds (but does not start) the mesh for this box.
func newMeshState(cfg mesh.Config, opts *MeshOptions, bkt bucket.Bucket, logger *zap.Logger) (*meshState, error) {
	if opts == nil {
		opts = new(MeshOptions)
	}
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
	timeout := time.Duration(opts.ForwardTimeout)
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	version, _ := caddy.Version()
	ms := &meshState{
		cfg:     cfg,
		marker:  mesh.Marker{Token: cfg.Token},
		roots:   roots,
		timeout: timeout,
		version: version,
		logger:  logger,
	}
	ms.ctx, ms.cancel = context.WithCancel(context.Background())
	ms.client = &mesh.Client{
		Token: cfg.Token,
		HTTPClient: &http.Client{
			Timeout: 15 * time.Second,
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
	ms.m, err = mesh.NewMembership(bkt, mesh.MembershipConfig{
		Self:        cfg.Self,
		Region:      cfg.Region,
		Domains:     cfg.Domains,
		Version:     version,
		Address:     opts.PublicAddress,
		Bucket:      bkt.String(),
		Beat:        time.Duration(opts.Beat),
		DeadAfter:   time.Duration(opts.DeadAfter),
		FenceMargin: time.Duration(opts.FenceMargin),
		OnFence:     ms.onFence,
		Logger:      logger.Named("membership"),
		WallClock:   testWallClock(logger),
	})
	if err != nil {
		ms.cancel()
		return nil, err
	}
	// Markers are signed and checked against the bucket's clock, not this box's wall
	// clock: boxes whose clocks disagree still recognize each other's (mesh/clock.go).
	ms.marker.Now = ms.m.BucketNow
	ms.box = &mesh.Box{Self: cfg.Self, Domains: cfg.Domains, Region: cfg.Region, Live: ms.m.Live, IsDraining: ms.m.Draining,
		Holders: new(mesh.Holders), Placement: ms.m.Placement()}
	ms.repl = &mesh.Replicator{Box: ms.box, Client: ms.client, Ctx: ms.ctx}
	ms.catchUp = &mesh.CatchUp{Box: ms.box, Peer: ms.client, Resync: time.Duration(opts.ResyncInterval),
		Logger: logger.Named("replication")}
	return ms, nil
}

// engineConfig points the engine's lease identity and liveness at the mesh: leases
// carry this box's SELF and incarnation, a lease is held while its holder's heartbeat
// is live, and scheduled wakes fire only on the HRW owner of a host.
func (ms *meshState) engineConfig(cfg *engine.Config, reg *registry.Registry) {
	mc := ms.m.Config()
	cfg.Holder = ms.cfg.Self
	cfg.Incarnation = mc.Incarnation
	cfg.HolderLive = ms.m.HolderLive
	cfg.Fresh = ms.m.Fresh
	// A fenced box's instances must be gone well before peers count it dead.
	cfg.FenceStopGrace = mc.FenceMargin / 2
	cfg.Owns = func(host string) bool { return ms.box.OwnsRoute(reg.Lookup, host) }
}

// start fences the engine until the first good heartbeat, then starts the loop. The
// first beat runs before start returns, so a healthy box serves from its first request.
func (ms *meshState) start(eng *engine.Engine, reg *registry.Registry) error {
	eng.SetFenced(true)
	ms.eng.Store(eng)
	if err := ms.m.Start(ms.ctx); err != nil {
		return err
	}
	ms.catchUp.Rows = func() ([]mesh.RouteRow, error) { return ms.box.Rows(reg) }
	ms.catchUp.Tombs = reg.Tombstones
	safego.Go(nil, ms.logger, "mesh catch-up", func() { ms.catchUp.Run(ms.ctx) })
	// The members' addresses, refused to spaces under network egress.
	safego.Go(nil, ms.logger, "mesh peer addresses", func() {
		mesh.WatchPeerAddrs(ms.ctx, ms.m, ms.m.Config().Beat, nil, eng.SetNetworkPeers)
	})
	return nil
}

// onFence relays the membership's fence decisions to the engine.
func (ms *meshState) onFence(fenced bool) {
	if eng := ms.eng.Load(); eng != nil {
		eng.SetFenced(fenced)
	}
}

// markDraining is the first step of a real shutdown: the heartbeat is rewritten as
// draining, so peers stop placing spaces here at their next listing while this box stays
// live for its leases. A failure is logged and the drain goes on: the loop keeps trying,
// and fencing still guards the writes.
func (ms *meshState) markDraining() {
	ctx, cancel := context.WithTimeout(context.Background(), ms.m.Config().OpTimeout+time.Second)
	defer cancel()
	start := time.Now()
	if err := ms.m.MarkDraining(ctx); err != nil {
		ms.logger.Error("marking this box draining in the mesh", zap.Error(err))
	} else {
		ms.logger.Info("draining: heartbeat marked, peers stop placing spaces here", zap.Duration("took", time.Since(start)))
	}
}

// leave is the last step of a real shutdown, after the drain: stop beating and delete
// the heartbeat.
func (ms *meshState) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := ms.m.Leave(ctx); err != nil {
		ms.logger.Error("leaving the mesh", zap.Error(err))
	} else {
		ms.logger.Info("left the mesh: heartbeat deleted", zap.Duration("took", time.Since(start)))
	}
}

// close ends fan-outs still running; called after the drain.
func (ms *meshState) close() {
	ms.m.Close()
	ms.cancel()
}

// errMeshOff is returned by mesh endpoints on a box without LCHAT_MESH_SELF.
var errMeshOff = errors.New("the mesh is off on this box (LCHAT_MESH_SELF is not set)")
