package mesh

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/libdns/libdns"
)

// DefaultRecordTTL is the TTL of an address record a relocation writes.
const DefaultRecordTTL = 5 * time.Minute

// RecordSetter is a DNSSetter over a libdns provider: it points a host of Zone at an
// address with an A (IPv4) or AAAA (IPv6) record.
type RecordSetter struct {
	// Zone holds the relocated hosts, without a trailing dot ("example.com").
	Zone string
	// TTL of the record written; 0 is DefaultRecordTTL.
	TTL time.Duration
	// Setter is the provider; Name names it in messages.
	Setter libdns.RecordSetter
	Name   string
}

// SetAddress points host's address record at ip and describes what it wrote. A host
// outside Zone is refused before the provider is asked.
func (d RecordSetter) SetAddress(ctx context.Context, host string, ip netip.Addr) (string, error) {
	// libdns.RelativeName only trims a suffix, so a host outside the zone would come
	// back as a name inside it ("a.example.org" in example.com): check first.
	if host != d.Zone && !strings.HasSuffix(host, "."+d.Zone) {
		return "", fmt.Errorf("%s is not in the relocation zone %s", host, d.Zone)
	}
	zone := d.Zone + "."
	name := libdns.RelativeName(host+".", zone)
	ttl := d.TTL
	if ttl == 0 {
		ttl = DefaultRecordTTL
	}
	if _, err := d.Setter.SetRecords(ctx, zone, []libdns.Record{libdns.Address{Name: name, TTL: ttl, IP: ip}}); err != nil {
		return "", fmt.Errorf("setting the record of %s through %s: %v", host, d.Name, err)
	}
	typ := "A"
	if ip.Is6() {
		typ = "AAAA"
	}
	return fmt.Sprintf("%s %s → %s (ttl %s) via %s", typ, host, ip, ttl, d.Name), nil
}

var _ DNSSetter = RecordSetter{}
