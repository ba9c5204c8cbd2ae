package lchat

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/registry"
)

func TestEngineKind(t *testing.T) {
	os.Setenv("LCHAT_TEST_KIND_TOKEN", "tok")
	repl := caddy.NewReplacer()
	expand := func(s string) string { return repl.ReplaceKnown(s, "") }
	self, _ := os.Executable()

	k, err := (&Kind{Command: "{self}", Args: []string{"demo-space"}, Env: map[string]string{"T": "{env.LCHAT_TEST_KIND_TOKEN}"}}).engineKind("demo", expand)
	if err != nil {
		t.Fatal(err)
	}
	if k.Command != self || k.Env["T"] != "tok" || k.IdleTimeout != 10*time.Minute || k.StopSignal != syscall.SIGTERM ||
		k.StopGrace != 10*time.Second || k.ReadyTimeout != 30*time.Second || k.WakePath != "/" ||
		k.Replication != (engine.Replication{Class: "periodic", Interval: time.Minute}) {
		t.Fatalf("defaults not applied: %+v", k)
	}

	k, err = (&Kind{Command: "/bin/x", StopSignal: "int", Replication: &Replication{Class: "continuous"}}).engineKind("x", expand)
	if err != nil || k.StopSignal != syscall.SIGINT || k.Replication.Class != "continuous" {
		t.Fatalf("got %+v, %v", k, err)
	}

	for _, tc := range []struct {
		name string
		kind Kind
		want string
	}{
		{"demo", Kind{}, "command: required"},
		{"Demo", Kind{Command: "x"}, "invalid kind name"},
		{"demo", Kind{Command: "x", StopSignal: "SIGWHAT"}, "stop_signal"},
		{"demo", Kind{Command: "x", AllowedEnv: []string{"PATH"}}, "allowed_env: PATH"},
		{"demo", Kind{Command: "x", AllowedEnv: []string{"LD_PRELOAD"}}, "allowed_env: LD_PRELOAD"},
		{"demo", Kind{Command: "x", Replication: &Replication{Class: "hourly"}}, "replication.class"},
		{"demo", Kind{Command: "x", Replication: &Replication{Class: "sleep", Interval: caddy.Duration(time.Second)}}, "replication.interval"},
		{"demo", Kind{Command: "x", ReadyPath: "healthz"}, "ready_path"},
		{"demo", Kind{Command: "x", IdleTimeout: -1}, "idle_timeout"},
	} {
		_, err := tc.kind.engineKind(tc.name, expand)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("engineKind(%s, %+v) = %v, want %q", tc.name, tc.kind, err, tc.want)
		}
	}
}

func TestCheckRoute(t *testing.T) {
	a := &App{kinds: map[string]engine.Kind{"demo": {Name: "demo", AllowedEnv: []string{"ADMIN_TOKEN"}}}}
	for _, tc := range []struct {
		rt   registry.Route
		want string
	}{
		{registry.Route{Host: "a.example.com", Kind: "demo", Hibernate: true, Env: map[string]string{"ADMIN_TOKEN": "x"}}, ""},
		{registry.Route{Host: "a.example.com", Upstream: "127.0.0.1:9"}, ""},
		{registry.Route{Host: "a.example.com", Kind: "chat", Hibernate: true}, `kind "chat" is not configured on this box (configured: demo)`},
		{registry.Route{Host: "a.example.com", Kind: "demo", Hibernate: true, Env: map[string]string{"PATH": "/evil"}}, "env PATH is not allowed"},
		{registry.Route{Host: "A.example.com", Kind: "demo", Hibernate: true}, "lowercase"},
	} {
		err := a.checkRoute(&tc.rt)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("checkRoute(%s) = %v, want %q", tc.rt.Host, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "/evil") {
			t.Errorf("error echoes an env value: %v", err)
		}
	}
}

func TestUnmarshalCaddyfile(t *testing.T) {
	d := caddyfile.NewTestDispenser(`lchat {
		state_dir /srv/state
		max_awake 3
		wake_scan_interval 5s
		drain_timeout 90s
		kind demo {
			command {self} demo-space --flag
			env GREETING hello
			allowed_env ADMIN_TOKEN SEED_NAME
			idle_timeout 2m
			stop_signal SIGINT
			stop_grace 3s
			ready_path /healthz
			ready_timeout 20s
			replication periodic 15s
			wake_path /wake
		}
	}`)
	var a App
	if err := a.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	k := a.Kinds["demo"]
	if a.StateDir != "/srv/state" || a.MaxAwake != 3 || a.WakeScanInterval != caddy.Duration(5*time.Second) || k == nil ||
		a.DrainTimeout != caddy.Duration(90*time.Second) ||
		k.Command != "{self}" || strings.Join(k.Args, " ") != "demo-space --flag" || k.Env["GREETING"] != "hello" ||
		len(k.AllowedEnv) != 2 || k.IdleTimeout != caddy.Duration(2*time.Minute) || k.StopSignal != "SIGINT" ||
		k.ReadyPath != "/healthz" || k.Replication.Class != "periodic" || k.Replication.Interval != caddy.Duration(15*time.Second) ||
		k.WakePath != "/wake" {
		t.Fatalf("parsed %+v kind %+v", a, k)
	}

	for input, want := range map[string]string{
		"lchat {\n frobnicate\n}":                       "unrecognized subdirective frobnicate",
		"lchat {\n kind demo {\n bogus 1\n }\n}":        "unrecognized subdirective bogus",
		"lchat {\n kind\n}":                             "wrong argument count",
		"lchat {\n kind demo {\n command\n }\n}":        "wrong argument count",
		"lchat {\n max_awake many\n}":                   "max_awake",
		"lchat {\n drain_timeout\n}":                    "wrong argument count",
		"lchat {\n kind demo {\n idle_timeout x\n }\n}": "idle_timeout",
		"lchat {\n kind demo {\n env ONLY\n }\n}":       "wrong argument count",
		"lchat extra":                                   "wrong argument count",
	} {
		var a App
		err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", input, err, want)
		}
	}

	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("lchat {\n flush_interval 100ms\n retry_after 7s\n}")); err != nil || *h.FlushInterval != caddy.Duration(100*time.Millisecond) || h.RetryAfter != caddy.Duration(7*time.Second) {
		t.Fatalf("handler: %+v %v", h, err)
	}
	if err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser("lchat {\n nope\n}")); err == nil {
		t.Fatal("handler accepted an unknown subdirective")
	}
}

func TestGlobalOptionMerges(t *testing.T) {
	v, err := parseGlobalOption(caddyfile.NewTestDispenser("lchat {\n kind a {\n command /bin/a\n }\n}"), nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err = parseGlobalOption(caddyfile.NewTestDispenser("lchat {\n kind b {\n command /bin/b\n }\n}"), v)
	if err != nil {
		t.Fatal(err)
	}
	var a App
	if err := json.Unmarshal(v.(httpcaddyfile.App).Value, &a); err != nil {
		t.Fatal(err)
	}
	if a.Kinds["a"] == nil || a.Kinds["b"] == nil {
		t.Fatalf("repeated lchat blocks did not merge: %s", v.(httpcaddyfile.App).Value)
	}
}

func TestRequestHost(t *testing.T) {
	for in, want := range map[string]string{
		"demo.localhost:8080": "demo.localhost",
		"Demo.Example.COM":    "demo.example.com",
		"a.example.com.":      "a.example.com",
		"a.example.com":       "a.example.com",
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = in
		if got := requestHost(r); got != want {
			t.Errorf("requestHost(%q) = %q, want %q", in, got, want)
		}
	}
	if dialAddress("/run/x.sock") != "unix//run/x.sock" || dialAddress("127.0.0.1:9") != "127.0.0.1:9" {
		t.Fatal("dialAddress")
	}
	if snakeCase("LeaseConflicts") != "lease_conflicts" || snakeCase("wakes") != "wakes" {
		t.Fatal("snakeCase")
	}
}
