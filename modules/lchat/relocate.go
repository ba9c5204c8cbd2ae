package lchat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/libdns/libdns"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/internal/caddyfileutil"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/space"
)

// RelocateDNS is the DNS provider `relocate --move-dns` repoints a space's A record
// through.
type RelocateDNS struct {
	// ProviderRaw is a dns.providers module that can set records (libdns RecordSetter),
	// e.g. {"name": "route53", ...} or {"name": "dnsimple", ...}.
	ProviderRaw json.RawMessage `json:"provider,omitempty" caddy:"namespace=dns.providers inline_key=name"`
	// Zone is the DNS zone the relocated hosts are in, e.g. "example.com". Required.
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
	if ip := a.Mesh.PublicAddress; ip != "" {
		if _, err := netip.ParseAddr(ip); err != nil {
			return fmt.Errorf("mesh.public_address: %q is not an IP address", ip)
		}
	}
	if d := a.Mesh.RelocateDNS; d != nil {
		if d.ProviderRaw == nil {
			return errors.New("mesh.relocate_dns: a provider is required")
		}
		d.Zone = strings.TrimSuffix(strings.TrimSpace(d.Zone), ".")
		if d.Zone == "" {
			return errors.New("mesh.relocate_dns: zone is required")
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

// liveMembersIn lists the live heartbeats in b by b's own clock: the boxes of a region
// whose heartbeats are in another bucket than this box's.
func liveMembersIn(ctx context.Context, b bucket.Bucket, deadAfter time.Duration) ([]mesh.Member, error) {
	var out []mesh.Member
	token := ""
	var now time.Time
	for {
		page, err := b.List(ctx, mesh.MembersPrefix, token)
		if err != nil {
			return nil, fmt.Errorf("listing heartbeats in %s: %v", b, err)
		}
		if now.IsZero() {
			now = page.Now
		}
		if now.IsZero() {
			now = time.Now()
		}
		for _, o := range page.Objects {
			self, ok := mesh.SelfFromKey(o.Key)
			if !ok || now.Sub(o.LastModified) > deadAfter {
				continue
			}
			obj, err := b.Get(ctx, o.Key)
			if err != nil {
				continue // gone since the listing
			}
			raw, err := io.ReadAll(io.LimitReader(obj.Body, 64<<10))
			obj.Body.Close()
			var hb mesh.Heartbeat
			if err != nil || json.Unmarshal(raw, &hb) != nil {
				continue
			}
			mem := mesh.Member{Self: self, LastModified: o.LastModified, Age: max(now.Sub(o.LastModified), 0)}
			hb.ApplyTo(&mem)
			out = append(out, mem)
		}
		if page.NextToken == "" {
			break
		}
		token = page.NextToken
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Self < out[j].Self })
	return out, nil
}

// ErrSpaceAwake means a relocation's copy found the space's lease held by a live box.
var ErrSpaceAwake = errors.New("the space is awake")

// CopyResult says what copySpace did.
type CopyResult struct {
	// Generation is the manifest generation now in the destination (0: none anywhere).
	Generation int64 `json:"generation"`
	// Blobs and Bytes count what was uploaded; blobs already there are not.
	Blobs int   `json:"blobs"`
	Bytes int64 `json:"bytes"`
	// Skipped is set when the destination already had this generation or a newer one.
	Skipped bool `json:"skipped,omitempty"`
	// DestGeneration is the destination's generation when it was left alone.
	DestGeneration int64 `json:"dest_generation,omitempty"`
}

// copySpace copies spaces/<host>/ (blobs, then the manifest; never the lease) from src
// to dst. It refuses while the lease in src or dst is held by a live box (srcLive and
// dstLive judge the holders), leaves a destination with an equal or newer manifest
// generation alone, streams every blob through this box (the buckets differ, so a
// server-side copy cannot cross), and writes the manifest with compare-and-swap against
// what it read in dst. A source that changed during the copy (the space woke) fails
// after the blobs, before the manifest.
func copySpace(ctx context.Context, src, dst bucket.Bucket, host string, srcLive, dstLive space.LiveFunc) (CopyResult, error) {
	var res CopyResult
	if err := checkAsleep(ctx, src, host, srcLive, "source"); err != nil {
		return res, err
	}
	if err := checkAsleep(ctx, dst, host, dstLive, "destination"); err != nil {
		return res, err
	}
	sm, setag, err := space.ReadManifest(ctx, src, host)
	if err != nil {
		return res, fmt.Errorf("source: %v", err)
	}
	dm, detag, err := space.ReadManifest(ctx, dst, host)
	if err != nil {
		return res, fmt.Errorf("destination: %v", err)
	}
	if sm == nil {
		if dm != nil {
			res.Skipped, res.Generation, res.DestGeneration = true, dm.Generation, dm.Generation
		}
		return res, nil
	}
	if dm != nil && dm.Generation >= sm.Generation {
		res.Skipped, res.Generation, res.DestGeneration = true, dm.Generation, dm.Generation
		return res, nil
	}
	done := map[string]bool{}
	for _, f := range sm.Files {
		if done[f.SHA256] {
			continue
		}
		done[f.SHA256] = true
		n, copied, err := copyBlob(ctx, src, dst, space.BlobKey(host, f.SHA256), f.Size)
		if err != nil {
			return res, err
		}
		if copied {
			res.Blobs++
			res.Bytes += n
		}
	}
	// The source must still be the state just copied, and still asleep.
	if _, etag, err := space.ReadManifest(ctx, src, host); err != nil || etag != setag {
		return res, fmt.Errorf("%w: the source manifest changed during the copy (the space woke); re-run when it sleeps", ErrSpaceAwake)
	}
	if err := checkAsleep(ctx, src, host, srcLive, "source"); err != nil {
		return res, err
	}
	if _, err := space.WriteManifest(ctx, dst, host, sm, detag); err != nil {
		if errors.Is(err, space.ErrFenced) {
			return res, errors.New("the destination manifest changed during the copy; nothing was overwritten, re-run to compare again")
		}
		return res, fmt.Errorf("destination: %v", err)
	}
	res.Generation = sm.Generation
	return res, nil
}

// checkAsleep fails with ErrSpaceAwake when b's lease on host is held by a live box.
func checkAsleep(ctx context.Context, b bucket.Bucket, host string, live space.LiveFunc, side string) error {
	l, _, err := space.ReadLease(ctx, b, host)
	if errors.Is(err, bucket.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: reading lease: %v", side, err)
	}
	if (space.Holder{Live: live}).Free(l) {
		return nil
	}
	return fmt.Errorf("%w in the %s bucket (lease held by %s); relocate it while it sleeps", ErrSpaceAwake, side, l.Holder)
}

// copyBlob streams key from src to dst unless dst has it already with the same size
// (blobs are content-addressed: same key, same bytes).
func copyBlob(ctx context.Context, src, dst bucket.Bucket, key string, size int64) (int64, bool, error) {
	if info, err := dst.Head(ctx, key); err == nil && info.Size == size {
		return 0, false, nil
	} else if err != nil && !errors.Is(err, bucket.ErrNotFound) {
		return 0, false, fmt.Errorf("destination: %s: %v", key, err)
	}
	obj, err := src.Get(ctx, key)
	if err != nil {
		return 0, false, fmt.Errorf("source: %s: %v", key, err)
	}
	defer obj.Body.Close()
	if obj.Size != size {
		return 0, false, fmt.Errorf("source: %s is %d bytes, the manifest says %d", key, obj.Size, size)
	}
	if _, err := dst.Put(ctx, key, obj.Body, obj.Size, bucket.Cond{}); err != nil {
		return 0, false, fmt.Errorf("destination: %s: %v", key, err)
	}
	return obj.Size, true, nil
}

// setARecord points host's A (or AAAA) record at ip through the relocation provider.
func (d *RelocateDNS) setARecord(ctx context.Context, host string, ip netip.Addr) (string, error) {
	zone := d.Zone + "."
	name := libdns.RelativeName(host+".", zone)
	if name == host+"." {
		return "", fmt.Errorf("%s is not in the relocation zone %s", host, d.Zone)
	}
	ttl := time.Duration(d.TTL)
	if ttl == 0 {
		ttl = 5 * time.Minute
	}
	if _, err := d.setter.SetRecords(ctx, zone, []libdns.Record{libdns.Address{Name: name, TTL: ttl, IP: ip}}); err != nil {
		return "", fmt.Errorf("setting the record of %s through %s: %v", host, d.name, err)
	}
	typ := "A"
	if ip.Is6() {
		typ = "AAAA"
	}
	return fmt.Sprintf("%s %s → %s (ttl %s) via %s", typ, host, ip, ttl, d.name), nil
}

// unmarshalCaddyfile reads a relocate_dns block.
//
//	relocate_dns {
//		provider <name> ...
//		zone <zone>
//		ttl <duration>
//	}
func (r *RelocateDNS) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "provider":
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			unm, err := caddyfile.UnmarshalModule(d, "dns.providers."+name)
			if err != nil {
				return err
			}
			r.ProviderRaw = caddyconfig.JSONModuleObject(unm, "name", name, nil)
		case "zone":
			if err := caddyfileutil.OneArg(d, &r.Zone); err != nil {
				return err
			}
		case "ttl":
			if err := durationArg(d, &r.TTL); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized subdirective %s", d.Val())
		}
	}
	return nil
}

// sameBucket reports whether two bucket descriptions (String(), as advertised in
// heartbeats) name the same store. A description carries the endpoint only when it was
// configured explicitly ("s3://b/p at http://host:port"), not when it came from
// AWS_ENDPOINT_URL_S3, so the endpoints are compared only when both carry one.
func sameBucket(a, b string) bool {
	abase, aend, _ := strings.Cut(a, " at ")
	bbase, bend, _ := strings.Cut(b, " at ")
	return abase == bbase && (aend == "" || bend == "" || aend == bend)
}
