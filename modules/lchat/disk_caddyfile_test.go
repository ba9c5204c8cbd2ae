package lchat

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lchat/lchat-caddy/engine"
)

// TestDiskCaddyfile: limits.disk and tmp reach the engine's kind as parsed; a size that
// is no size is refused with the directive named, and one too small for ext4 by the
// engine, the same for JSON and the Caddyfile.
func TestDiskCaddyfile(t *testing.T) {
	var a App
	err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`lchat {
		kind app {
			command /bin/app
			tmp private
			limits {
				disk 256MiB
			}
		}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	kc := a.Kinds["app"]
	k, err := kc.engineKind("app", func(s string) string { return s })
	if err != nil {
		t.Fatal(err)
	}
	if k.Limits.DiskBytes != 256<<20 || k.Tmp != engine.TmpPrivate {
		t.Fatalf("engine kind: disk %d, tmp %q", k.Limits.DiskBytes, k.Tmp)
	}
	for input, want := range map[string]string{
		"lchat {\n kind k {\n limits {\n disk 0\n }\n }\n}":         `disk: want a size such as 64MiB, got "0"`,
		"lchat {\n kind k {\n limits {\n disk -1\n }\n }\n}":        `disk: want a size such as 64MiB, got "-1"`,
		"lchat {\n kind k {\n limits {\n disk lots\n }\n }\n}":      `disk: want a size such as 64MiB, got "lots"`,
		"lchat {\n kind k {\n limits {\n disk\n }\n }\n}":           "wrong argument count",
		"lchat {\n kind k {\n tmp\n }\n}":                           "wrong argument count",
		"lchat {\n kind k {\n tmp private host\n }\n}":              "wrong argument count",
		"lchat {\n kind k {\n limits {\n disk 1GiB 2GiB\n }\n }\n}": "wrong argument count",
	} {
		var a App
		err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", input, err, want)
		}
	}
	for _, c := range []struct {
		kc   Kind
		want string
	}{
		{Kind{Command: "/bin/app", Limits: &Limits{Disk: 10_000}}, "limits.disk: 10000 bytes is below the smallest disk, 16777216 (16MiB)"},
		{Kind{Command: "/bin/app", Limits: &Limits{Disk: -1}}, "limits.disk: must be positive"},
		{Kind{Command: "/bin/app", Isolation: "none", Limits: &Limits{Disk: 1 << 30}}, "limits.disk needs the space's own uid: set isolation on"},
		{Kind{Command: "/bin/app", Tmp: "host", Limits: &Limits{Disk: 1 << 30}}, "tmp host would leave /tmp outside it"},
		{Kind{Command: "/bin/app", Tmp: "shared"}, `unknown tmp "shared": private or host`},
		{Kind{Command: "/bin/app", Isolation: "none", Tmp: "private"}, "tmp private needs the space's own uid"},
	} {
		k, err := c.kc.engineKind("k", func(s string) string { return s })
		if err != nil {
			t.Fatal(err)
		}
		if err := engine.CheckKinds(map[string]engine.Kind{"k": k}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.kc, err, c.want)
		}
	}
}
