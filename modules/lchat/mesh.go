package lchat

import (
	"encoding/json"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/box"
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
	}
}
