package lchat

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/lchat/lchat-caddy/engine"
)

// TestEngineKind: the module converts a kind (placeholders, {self}, durations, the
// signal name); the defaults and the rules are the engine's (engine.TestKindDefaultsAndValidation).
func TestEngineKind(t *testing.T) {
	os.Setenv("LCHAT_TEST_KIND_TOKEN", "tok")
	repl := caddy.NewReplacer()
	expand := func(s string) string { return repl.ReplaceKnown(s, "") }
	self, _ := os.Executable()

	k, err := (&Kind{Command: "{self}", Args: []string{"demo-space", "{env.LCHAT_TEST_KIND_TOKEN}"}, Env: map[string]string{"T": "{env.LCHAT_TEST_KIND_TOKEN}"},
		IdleTimeout: caddy.Duration(time.Minute), StopSignal: "int", Replication: &Replication{Class: "continuous"}}).engineKind("demo", expand)
	if err != nil {
		t.Fatal(err)
	}
	if k.Name != "demo" || k.Command != self || k.Args[1] != "tok" || k.Env["T"] != "tok" || k.IdleTimeout != time.Minute ||
		k.StopSignal != syscall.SIGINT || k.Replication.Class != "continuous" {
		t.Fatalf("converted %+v", k)
	}
	if err := engine.CheckKinds(map[string]engine.Kind{"demo": k}); err != nil {
		t.Fatalf("a converted valid kind is refused: %v", err)
	}
	if _, err := (&Kind{Command: "x", StopSignal: "SIGWHAT"}).engineKind("demo", expand); err == nil || !strings.Contains(err.Error(), "stop_signal") {
		t.Errorf("unknown signal: %v", err)
	}
	bad, _ := (&Kind{Command: "x", IdleTimeout: -1}).engineKind("demo", expand)
	if err := engine.CheckKinds(map[string]engine.Kind{"demo": bad}); err == nil || !strings.Contains(err.Error(), "idle_timeout") {
		t.Errorf("negative idle_timeout: %v", err)
	}
}

// TestDemoSpaceCommand: {demo_space} is lchat-demo-space beside this binary when it is
// there, else this binary's demo-space alias, with the kind's args after either; and
// socket_activation reaches the engine's kind.
func TestDemoSpaceCommand(t *testing.T) {
	self, _ := os.Executable()
	expand := func(s string) string { return s }
	kc := &Kind{Command: "{demo_space}", Args: []string{"--host", "x"}, SocketActivation: true}
	k, err := kc.engineKind("demo", expand)
	if err != nil {
		t.Fatal(err)
	}
	if k.Command != self || strings.Join(k.Args, " ") != "demo-space --host x" || !k.SocketActivation {
		t.Fatalf("without %s: %s %v (activation %v), want the alias", DemoSpaceBinary, k.Command, k.Args, k.SocketActivation)
	}
	small := filepath.Join(filepath.Dir(self), DemoSpaceBinary)
	if err := os.WriteFile(small, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Skipf("cannot place %s beside the test binary: %v", small, err)
	}
	defer os.Remove(small)
	if k, err = kc.engineKind("demo", expand); err != nil || k.Command != small || strings.Join(k.Args, " ") != "--host x" {
		t.Fatalf("with %s: %s %v %v, want the small binary", DemoSpaceBinary, k.Command, k.Args, err)
	}
}

func TestUnmarshalCaddyfile(t *testing.T) {
	d := caddyfile.NewTestDispenser(`lchat {
		state_dir /srv/state
		max_awake 3
		max_starting 6
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
			retention 72h
			gc_grace 30m
			socket_activation on
		}
	}`)
	var a App
	if err := a.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	k := a.Kinds["demo"]
	if a.StateDir != "/srv/state" || a.MaxAwake != 3 || a.MaxStarting != 6 || a.WakeScanInterval != caddy.Duration(5*time.Second) || k == nil ||
		a.DrainTimeout != caddy.Duration(90*time.Second) ||
		k.Command != "{self}" || strings.Join(k.Args, " ") != "demo-space --flag" || k.Env["GREETING"] != "hello" ||
		len(k.AllowedEnv) != 2 || k.IdleTimeout != caddy.Duration(2*time.Minute) || k.StopSignal != "SIGINT" ||
		k.ReadyPath != "/healthz" || k.Replication.Class != "periodic" || k.Replication.Interval != caddy.Duration(15*time.Second) ||
		k.WakePath != "/wake" || k.Retention != caddy.Duration(72*time.Hour) ||
		k.GCGrace != caddy.Duration(30*time.Minute) || !k.SocketActivation {
		t.Fatalf("parsed %+v kind %+v", a, k)
	}

	for input, want := range map[string]string{
		"lchat {\n frobnicate\n}":                              "unrecognized subdirective frobnicate",
		"lchat {\n kind demo {\n bogus 1\n }\n}":               "unrecognized subdirective bogus",
		"lchat {\n kind\n}":                                    "wrong argument count",
		"lchat {\n kind demo {\n command\n }\n}":               "wrong argument count",
		"lchat {\n max_awake many\n}":                          "max_awake",
		"lchat {\n drain_timeout\n}":                           "wrong argument count",
		"lchat {\n kind demo {\n idle_timeout x\n }\n}":        "idle_timeout",
		"lchat {\n kind demo {\n retention\n }\n}":             "wrong argument count",
		"lchat {\n kind demo {\n gc_grace soon\n }\n}":         "gc_grace",
		"lchat {\n kind demo {\n env ONLY\n }\n}":              "wrong argument count",
		"lchat {\n kind demo {\n socket_activation\n }\n}":     "wrong argument count",
		"lchat {\n kind demo {\n socket_activation yes\n }\n}": "socket_activation: \"yes\" is not on or off",
		"lchat extra": "wrong argument count",
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
}

func TestConnectionsCaddyfile(t *testing.T) {
	var a App
	err := a.UnmarshalCaddyfile(caddyfile.NewTestDispenser("lchat {\n connections {\n max_message 64KiB\n max_pending 16\n max_box_pending_bytes 1GiB\n write_timeout 3s\n }\n}"))
	if err != nil {
		t.Fatal(err)
	}
	l := a.Connections.limits()
	if l.MaxMessage != 64<<10 || l.MaxPending != 16 || l.MaxBoxPendingBytes != 1<<30 || l.WriteTimeout != 3*time.Second || l.MaxOutBytes != 0 {
		t.Errorf("limits %+v", l)
	}
	for _, bad := range []string{
		"lchat {\n connections {\n nope 1\n }\n}",
		"lchat {\n connections {\n max_pending -1\n }\n}",
		"lchat {\n connections {\n max_message lots\n }\n}",
		"lchat {\n connections extra {\n }\n}",
	} {
		if err := new(App).UnmarshalCaddyfile(caddyfile.NewTestDispenser(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}
