package lchat

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/mesh"
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
	// TestClockOffset shifts this box's wall clock as the mesh sees it. Test-only, JSON
	// only: tests that run boxes whose clocks disagree set it (tests/meshe2e); never set
	// it on a real box. Default 0.
	TestClockOffset caddy.Duration `json:"test_clock_offset,omitempty"`
	// MemoryBudget is the bytes this box has for spaces, published in its heartbeat for
	// bounded-load placement and the fleet's desired box count. Default: the box's memory
	// (MemTotal, or its own cgroup's memory.max when lower) less the larger of 512 MiB and
	// 10%.
	MemoryBudget int64 `json:"memory_budget,omitempty"`
	// BalanceFactor is bounded-load placement's bound in percent of the mean warm set, as
	// HAProxy's hash-balance-factor: a wake goes past its HRW owner when that box would
	// pass BalanceFactor% of the mean. At least 101; -1 turns it off (plain HRW). Default
	// 125.
	BalanceFactor int `json:"balance_factor,omitempty"`
	// AutoscaleHeadroom is the percent of every box's budget the desired box count keeps
	// free (lchat_fleet_desired_boxes). Default 20.
	AutoscaleHeadroom int `json:"autoscale_headroom,omitempty"`
	// AutoscaleHysteresis is the extra percent the warm set must fall by before the
	// desired count drops below the boxes running. Default 10.
	AutoscaleHysteresis int `json:"autoscale_hysteresis,omitempty"`
}

// validate checks the memory and autoscaling settings.
func (o *MeshOptions) validate() error {
	if o == nil {
		return nil
	}
	if o.MemoryBudget < 0 {
		return fmt.Errorf("mesh.memory_budget: %d is negative", o.MemoryBudget)
	}
	if f := o.BalanceFactor; f != 0 && f != -1 && f <= 100 {
		return fmt.Errorf("mesh.balance_factor: %d: want more than 100 (percent of the mean), or -1 for none", f)
	}
	if o.AutoscaleHeadroom < 0 || o.AutoscaleHeadroom > 1000 {
		return fmt.Errorf("mesh.autoscale_headroom: %d: want a percent from 0 to 1000", o.AutoscaleHeadroom)
	}
	if o.AutoscaleHysteresis < 0 || o.AutoscaleHysteresis > 1000 {
		return fmt.Errorf("mesh.autoscale_hysteresis: %d: want a percent from 0 to 1000", o.AutoscaleHysteresis)
	}
	return nil
}

// options are o for the box; nil o is the defaults.
func (o *MeshOptions) options() box.MeshOptions {
	if o == nil {
		return box.MeshOptions{}
	}
	return box.MeshOptions{
		Beat:            time.Duration(o.Beat),
		DeadAfter:       time.Duration(o.DeadAfter),
		FenceMargin:     time.Duration(o.FenceMargin),
		TrustedCAFiles:  o.TrustedCAFiles,
		ForwardTimeout:  time.Duration(o.ForwardTimeout),
		ResyncInterval:  time.Duration(o.ResyncInterval),
		PublicAddress:   o.PublicAddress,
		TestClockOffset: time.Duration(o.TestClockOffset),
		MemoryBudget:    o.MemoryBudget,
		Balance:         balance(o.BalanceFactor),
		Autoscale: mesh.Autoscale{Headroom: float64(o.AutoscaleHeadroom) / 100,
			Hysteresis: float64(o.AutoscaleHysteresis) / 100},
	}
}

// balance is the box's ε for a balance_factor: 0 the default, -1 none.
func balance(factor int) float64 {
	switch {
	case factor == 0:
		return 0
	case factor < 0:
		return -1
	}
	return float64(factor-100) / 100
}
