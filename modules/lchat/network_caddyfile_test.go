package lchat

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lchat/lchat-caddy/engine"
)

// TestNetworkCaddyfile: the kind block's network and its allow list reach the engine's
// kind as parsed; mistakes are refused with the line's directive named.
func TestNetworkCaddyfile(t *testing.T) {
	var a App
	err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`lchat {
		kind db {
			command /bin/app
			network egress {
				allow 10.1.0.0/16 fd12::/16
				allow 192.0.2.7
			}
		}
		kind offline {
			command /bin/app
			network none
		}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	db, off := a.Kinds["db"], a.Kinds["offline"]
	if db.Network != "egress" || strings.Join(db.NetworkAllow, " ") != "10.1.0.0/16 fd12::/16 192.0.2.7" || off.Network != "none" || off.NetworkAllow != nil {
		t.Fatalf("parsed db %+v offline %+v", db, off)
	}
	repl := caddy.NewReplacer()
	k, err := db.engineKind("db", func(s string) string { return repl.ReplaceKnown(s, "") })
	if err != nil {
		t.Fatal(err)
	}
	if k.Network != engine.NetworkEgress || len(k.NetworkAllow) != 3 || k.NetworkAllow[2].String() != "192.0.2.7/32" {
		t.Fatalf("engine kind %+v", k)
	}

	for input, want := range map[string]string{
		"lchat {\n kind k {\n network\n }\n}":                                  "wrong argument count",
		"lchat {\n kind k {\n network egress none\n }\n}":                      "wrong argument count",
		"lchat {\n kind k {\n network egress {\n allow\n }\n }\n}":             "wrong argument count",
		"lchat {\n kind k {\n network egress {\n allow 10.1.2.3/16\n }\n }\n}": "did you mean 10.1.0.0/16?",
		"lchat {\n kind k {\n network egress {\n allow intranet\n }\n }\n}":    "neither an address nor a CIDR range",
		"lchat {\n kind k {\n network egress {\n deny 10.0.0.0/8\n }\n }\n}":   "unrecognized subdirective deny",
	} {
		var a App
		err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", input, err, want)
		}
	}
	// The mode itself is the engine's to check, the same for JSON and the Caddyfile.
	bad, err := (&Kind{Command: "/bin/app", Network: "private"}).engineKind("k", func(s string) string { return s })
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.CheckKinds(map[string]engine.Kind{"k": bad}); err == nil || !strings.Contains(err.Error(), `unknown network "private"`) {
		t.Errorf("network private: %v", err)
	}
	if _, err := (&Kind{Command: "/bin/app", Network: "egress", NetworkAllow: []string{"10.0.0.0/33"}}).engineKind("k", func(s string) string { return s }); err == nil || !strings.Contains(err.Error(), "network_allow") {
		t.Errorf("a bad allow entry in JSON: %v", err)
	}
}
