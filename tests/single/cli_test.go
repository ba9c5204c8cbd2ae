package single

import (
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// plainErrorLine fails unless r is exactly one plain "Error: <want...>" line on stderr
// (no JSON log line, no stack) and exit code code.
func plainErrorLine(t *testing.T, what string, r harness.CLIRun, code int, want string) {
	t.Helper()
	if r.Code != code {
		t.Errorf("%s: exit code %d, want %d\nstdout: %s\nstderr: %s", what, r.Code, code, r.Stdout, r.Stderr)
	}
	if !strings.HasPrefix(r.Stderr, "Error: "+want) || strings.Count(r.Stderr, "\n") != 1 || !strings.HasSuffix(r.Stderr, "\n") {
		t.Errorf("%s: stderr %q, want one line starting %q", what, r.Stderr, "Error: "+want)
	}
	if strings.Contains(r.Stderr, `"level"`) || strings.Contains(r.Stderr, "goroutine ") {
		t.Errorf("%s: stderr has a log line or a stack: %q", what, r.Stderr)
	}
}

// Every lchat-caddy subcommand reports an error as one plain line on stderr, with an exit
// code that tells bad input (4) from an admin API it cannot reach (3) from a failure the
// server reported (1); Caddy's own commands keep Caddy's behaviour.
func TestCLIErrorsArePlain(t *testing.T) {
	// Nothing listens on a reserved port: the admin API cannot be reached there.
	nowhere := harness.FreeAddr(t, "127.0.0.1")
	for _, c := range []struct {
		what string
		args []string
		code int
		want string
	}{
		{"a host in capitals", []string{"add-instance", "BAD_HOST", "--kind", "demo", "--address", nowhere}, 4, `host "BAD_HOST" must be lowercase`},
		{"no host", []string{"remove", "--address", nowhere}, 4, `accepts 1 arg(s), received 0 (usage: lchat-caddy remove <host>`},
		{"an unknown flag", []string{"routes", "--colour", "--address", nowhere}, 4, `unknown flag: --colour (usage: lchat-caddy routes`},
		{"both --on and --off", []string{"hibernate", "a.example.com", "--on", "--off", "--address", nowhere}, 4, `give exactly one of --on or --off`},
		{"a bad --at", []string{"restore", "a.example.com", "--at", "yesterday", "--address", nowhere}, 4, `--at: `},
		{"a bad <min>", []string{"seed-ids", "many", "--address", nowhere}, 4, `<min> must be a positive integer`},
		{"a bad peer URL", []string{"mesh-seed", "ftp://peer", "--address", nowhere}, 4, `peer URL: `},
		{"an admin API nobody serves", []string{"routes", "--address", nowhere}, 3, `cannot reach the admin API at ` + nowhere + `: dial tcp ` + nowhere + `: connect: connection refused`},
		{"no admin socket", []string{"fleet", "--address", "unix//nonexistent/admin.sock"}, 3, `cannot reach the admin API at unix//nonexistent/admin.sock`},
		{"admin API from the environment", []string{"next-id"}, 3, `cannot reach the admin API at ` + nowhere},
	} {
		r := harness.RunCLI(t, "", []string{"LCHAT_ADMIN_LISTEN=" + nowhere}, c.args...)
		plainErrorLine(t, c.what, r, c.code, c.want)
		if r.Stdout != "" {
			t.Errorf("%s: stdout %q, want nothing", c.what, r.Stdout)
		}
	}

	// A failure the server reports: its message, one line, exit 1.
	e := newEnv(t)
	b := e.box(t, cfgOpts{})
	r := b.CLIRun("add-instance", "cli.example.com", "--kind", "nope")
	plainErrorLine(t, "an unconfigured kind", r, 1, `kind "nope" is not configured on this box`)
	if r := b.CLIRun("routes"); r.Code != 0 || r.Stderr != "" || !strings.HasPrefix(r.Stdout, "HOST") {
		t.Errorf("routes: exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
	}

	// Caddy's own commands are Caddy's: its error is still its JSON log line.
	r = harness.RunCLI(t, "", nil, "reload", "--config", "/nonexistent/Caddyfile", "--address", nowhere)
	if r.Code != 1 || !strings.Contains(r.Stderr, `"level":"error"`) {
		t.Errorf("caddy reload: exit %d, stderr %q: want Caddy's own JSON error and exit 1", r.Code, r.Stderr)
	}
}
