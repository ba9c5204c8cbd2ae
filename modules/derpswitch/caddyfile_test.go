package derpswitch

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/filestorage"
)

func TestCaddyfileAdapt(t *testing.T) {
	input := `{
	derp_switch {
		derp_map_file /etc/lchat/derp.json
		home_region 2
		mode legacy
		prove {
			count 5
			timeout 1s
			interval 50ms
		}
		retry_backoff 5s 15s 1m
		drain 10s
	}
	derp_switch {
		autonegotiate {
			stability_window 2m
			max_switches_per_hour 3
			history 10m
		}
		echo_prefix ping:
		storage file_system /var/lib/lchat-caddy/derp
	}
}
`
	adapter := caddyconfig.GetAdapter("caddyfile")
	out, warnings, err := adapter.Adapt([]byte(input), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) > 0 {
		t.Fatalf("warnings: %v", warnings)
	}
	var cfg struct {
		Apps map[string]json.RawMessage `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	want := `{"derp_map_file":"/etc/lchat/derp.json","home_region":2,"mode":"legacy","prove":{"count":5,"timeout":1000000000,"interval":50000000},"retry_backoff":[5000000000,15000000000,60000000000],"drain":10000000000,"autonegotiate":{"stability_window":120000000000,"max_switches_per_hour":3,"history":600000000000},"echo_prefix":"ping:","storage":{"module":"file_system","root":"/var/lib/lchat-caddy/derp"}}`
	if got := string(cfg.Apps["derp_switch"]); got != want {
		t.Fatalf("adapted:\n got %s\nwant %s", got, want)
	}
}

func TestCaddyfileErrors(t *testing.T) {
	for _, tt := range []struct {
		in, want string
	}{
		{"derp_switch {\n bogus 1\n}", "unrecognized subdirective bogus"},
		{"derp_switch {\n home_region\n}", "wrong argument count"},
		{"derp_switch {\n home_region x\n}", "invalid syntax"},
		{"derp_switch {\n mode fast\n}", "mode must be mbb or legacy"},
		{"derp_switch {\n prove {\n  tries 3\n }\n}", "unrecognized prove subdirective tries"},
		{"derp_switch {\n retry_backoff\n}", "wrong argument count"},
		{"derp_switch {\n drain soon\n}", "duration"},
		{"derp_switch extra", "wrong argument count"},
		{"derp_switch {\n derp_map_file a.json b.json\n}", "wrong argument count"},
		{"derp_switch {\n mode mbb legacy\n}", "wrong argument count"},
		{"derp_switch {\n echo_prefix a: b:\n}", "wrong argument count"},
		{"derp_switch {\n derp_map `{bad`\n}", "invalid JSON"},
		{"derp_switch {\n autonegotiate {\n  dwell\n }\n}", "wrong argument count"},
		{"derp_switch {\n autonegotiate {\n  often 1\n }\n}", "unrecognized autonegotiate subdirective often"},
	} {
		d := caddyfile.NewTestDispenser(tt.in)
		err := new(App).UnmarshalCaddyfile(d)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: err = %v; want %q", tt.in, err, tt.want)
		}
	}
}
