package lchat

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	_ "github.com/lchat/lchat-caddy/modules/dnsproviders/dnsimple"
)

// TestRelocateCaddyfile: the mesh block's relocation options adapt to the JSON the app
// provisions (the provider and the region bucket as guest modules), and mistakes are
// named.
func TestRelocateCaddyfile(t *testing.T) {
	var a App
	err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`lchat {
		mesh {
			public_address 203.0.113.9
			resync_interval 30s
			relocate_dns {
				provider dnsimple {env.DNSIMPLE_TOKEN} {
					account_id 1010
				}
				zone example.com
				ttl 2m
			}
			region_bucket fi s3 fi-spaces {
				prefix fi/
				endpoint https://s3.fi.example.net
			}
		}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	m := a.Mesh
	if m == nil || m.PublicAddress != "203.0.113.9" || m.RelocateDNS == nil || m.RelocateDNS.Zone != "example.com" ||
		m.RelocateDNS.TTL != caddy.Duration(2*time.Minute) || m.ResyncInterval != caddy.Duration(30*time.Second) {
		t.Fatalf("parsed mesh options %+v", m)
	}
	var prov map[string]any
	if err := json.Unmarshal(m.RelocateDNS.ProviderRaw, &prov); err != nil || prov["name"] != "dnsimple" ||
		prov["api_access_token"] != "{env.DNSIMPLE_TOKEN}" || prov["account_id"] != "1010" {
		t.Errorf("provider JSON %s (%v)", m.RelocateDNS.ProviderRaw, err)
	}
	var bkt map[string]any
	if err := json.Unmarshal(m.RegionBucketsRaw["fi"], &bkt); err != nil || bkt["backend"] != "s3" ||
		bkt["bucket"] != "fi-spaces" || bkt["prefix"] != "fi/" || bkt["endpoint"] != "https://s3.fi.example.net" {
		t.Errorf("region bucket JSON %s (%v)", m.RegionBucketsRaw["fi"], err)
	}

	for input, want := range map[string]string{
		"lchat {\n mesh {\n relocate_dns {\n zone\n }\n }\n}":                     "wrong argument count",
		"lchat {\n mesh {\n resync_interval soon\n }\n}":                          "resync_interval",
		"lchat {\n mesh {\n relocate_dns {\n provider nosuch\n }\n }\n}":          "nosuch",
		"lchat {\n mesh {\n relocate_dns {\n bogus\n }\n }\n}":                    "unrecognized subdirective bogus",
		"lchat {\n mesh {\n region_bucket fi s3 a\n region_bucket fi s3 b\n }\n}": "given twice",
		"lchat {\n mesh {\n public_address\n }\n}":                                "wrong argument count",
		"lchat {\n mesh {\n relocate_dns {\n }\n relocate_dns {\n }\n }\n}":       "given twice",
	} {
		var a App
		err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err=%v, want %q", input, err, want)
		}
	}
}
