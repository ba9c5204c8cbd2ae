package lchat

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/libdns/libdns"

	"github.com/lchat/lchat-caddy/bucket"
)

// RelocateDNS is the DNS provider `relocate --move-dns` repoints a space's A record
// through.
type RelocateDNS struct {
	// ProviderRaw is a dns.providers module that can set records (libdns RecordSetter),
	// e.g. {"name": "route53", ...} or {"name": "dnsimple", ...}.
	ProviderRaw json.RawMessage `json:"provider,omitempty" caddy:"namespace=dns.providers inline_key=name"`
	// Zone is the DNS zone the relocated hosts are in, e.g. "example.com"; placeholders
	// are expanded. Default: the first wildcard domain.
	Zone string `json:"zone,omitempty"`
	// TTL of the A record written. Default 5m.
	TTL caddy.Duration `json:"ttl,omitempty"`

	setter libdns.RecordSetter
	name   string
}

// relocator is what a relocation uses besides the mesh: the DNS provider and the
// buckets of other regions, provisioned with the config.
type relocator struct {
	dns     *RelocateDNS
	buckets map[string]bucket.Bucket
}

// provisionRelocate loads mesh.relocate_dns and mesh.region_buckets.
func (a *App) provisionRelocate(ctx caddy.Context) error {
	if a.Mesh == nil {
		return nil
	}
	// The shipped mesh.Caddyfile sets these from the environment; an unset variable
	// means none (no public address; the zone of the first wildcard domain).
	repl := caddy.NewReplacer()
	a.Mesh.PublicAddress = strings.TrimSpace(repl.ReplaceKnown(a.Mesh.PublicAddress, ""))
	if ip := a.Mesh.PublicAddress; ip != "" {
		if _, err := netip.ParseAddr(ip); err != nil {
			return fmt.Errorf("mesh.public_address: %q is not an IP address", ip)
		}
	}
	if d := a.Mesh.RelocateDNS; d != nil {
		if d.ProviderRaw == nil {
			return errors.New("mesh.relocate_dns: a provider is required")
		}
		d.Zone = strings.TrimSuffix(strings.TrimSpace(repl.ReplaceKnown(d.Zone, "")), ".")
		if d.Zone == "" && len(a.WildcardDomains) > 0 {
			d.Zone = a.WildcardDomains[0]
		}
		if d.Zone == "" {
			return errors.New("mesh.relocate_dns: zone is required (or a wildcard domain to default to)")
		}
		if d.TTL < 0 {
			return errors.New("mesh.relocate_dns: ttl must not be negative")
		}
		mod, err := ctx.LoadModule(d, "ProviderRaw")
		if err != nil {
			return fmt.Errorf("mesh.relocate_dns: loading provider: %v", err)
		}
		setter, ok := mod.(libdns.RecordSetter)
		if !ok {
			return fmt.Errorf("mesh.relocate_dns: provider %T cannot set records", mod)
		}
		d.setter = setter
		if cm, ok := mod.(caddy.Module); ok {
			d.name = string(cm.CaddyModule().ID)
		}
		a.reloc.dns = d
	}
	if a.Mesh.RegionBucketsRaw != nil {
		mods, err := ctx.LoadModule(a.Mesh, "RegionBucketsRaw")
		if err != nil {
			return fmt.Errorf("mesh.region_buckets: %v", err)
		}
		a.reloc.buckets = make(map[string]bucket.Bucket)
		for region, mod := range mods.(map[string]any) {
			b, ok := mod.(bucket.Bucket)
			if !ok {
				return fmt.Errorf("mesh.region_buckets.%s: module %T is not a bucket", region, mod)
			}
			a.reloc.buckets[region] = b
		}
	}
	return nil
}
