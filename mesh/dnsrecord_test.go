package mesh

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/libdns/libdns"
)

// zoneRecorder is a libdns provider that keeps what it was asked to set.
type zoneRecorder struct {
	zone string
	recs []libdns.Record
	err  error
}

func (z *zoneRecorder) SetRecords(_ context.Context, zone string, recs []libdns.Record) ([]libdns.Record, error) {
	z.zone, z.recs = zone, recs
	return recs, z.err
}

func TestRecordSetter(t *testing.T) {
	for _, tc := range []struct {
		name     string
		host, ip string
		ttl      time.Duration
		fail     error
		wantName string
		wantTTL  time.Duration
		wantDesc string
		wantErr  string
	}{
		{name: "A record, default ttl", host: "a.example.com", ip: "203.0.113.9", wantName: "a", wantTTL: DefaultRecordTTL,
			wantDesc: "A a.example.com → 203.0.113.9 (ttl 5m0s) via testdns"},
		{name: "AAAA record, own ttl", host: "b.c.example.com", ip: "2001:db8::1", ttl: time.Minute, wantName: "b.c", wantTTL: time.Minute,
			wantDesc: "AAAA b.c.example.com → 2001:db8::1 (ttl 1m0s) via testdns"},
		{name: "outside the zone", host: "a.example.org", ip: "203.0.113.9", wantErr: "not in the relocation zone example.com"},
		{name: "suffix without a dot is outside", host: "a.badexample.com", ip: "203.0.113.9", wantErr: "not in the relocation zone example.com"},
		{name: "zone apex", host: "example.com", ip: "203.0.113.9", wantName: "@", wantTTL: DefaultRecordTTL,
			wantDesc: "A example.com → 203.0.113.9 (ttl 5m0s) via testdns"},
		{name: "provider fails", host: "a.example.com", ip: "203.0.113.9", fail: errors.New("throttled"), wantErr: "through testdns: throttled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &zoneRecorder{err: tc.fail}
			d := RecordSetter{Zone: "example.com", TTL: tc.ttl, Setter: rec, Name: "testdns"}
			desc, err := d.SetAddress(context.Background(), tc.host, netip.MustParseAddr(tc.ip))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("SetAddress = %q, %v; want error containing %q", desc, err, tc.wantErr)
				}
				if tc.fail == nil && rec.recs != nil {
					t.Fatalf("a refused host reached the provider: %v", rec.recs)
				}
				return
			}
			if err != nil || desc != tc.wantDesc {
				t.Fatalf("SetAddress = %q, %v; want %q", desc, err, tc.wantDesc)
			}
			if rec.zone != "example.com." || len(rec.recs) != 1 {
				t.Fatalf("provider got zone %q records %v", rec.zone, rec.recs)
			}
			rr := rec.recs[0].RR()
			if rr.Name != tc.wantName || rr.TTL != tc.wantTTL || rr.Data != tc.ip {
				t.Fatalf("record %+v, want name %q ttl %s data %s", rr, tc.wantName, tc.wantTTL, tc.ip)
			}
		})
	}
}
