package single

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// An operator's loop through the CLI alone, against a real server: every command given
// an unknown host says "no route", a bad flag combination names its flags, and the exit
// codes are docs/cli.md's.
func TestOperatorCLIErrors(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{})
	if r := b.CLIRun("add-instance", "op.example.com", "--kind", "demo"); r.Code != 0 {
		t.Fatalf("add-instance: exit %d: %s", r.Code, r.Stderr)
	}
	if r := b.CLIRun("add-instance", "live.example.com", "--upstream", "127.0.0.1:1"); r.Code != 0 {
		t.Fatalf("add-instance --upstream: exit %d: %s", r.Code, r.Stderr)
	}
	for _, c := range []struct {
		what string
		args []string
		code int
		want string
	}{
		{"status of an unknown host", []string{"status", "nope.example.com"}, 1, "no route for host nope.example.com"},
		{"sleep an unknown host", []string{"sleep", "nope.example.com"}, 1, "no route for host nope.example.com"},
		{"wake an unknown host", []string{"wake", "nope.example.com"}, 1, "no route for host nope.example.com"},
		{"remove an unknown host", []string{"remove", "nope.example.com"}, 1, "no route for host nope.example.com"},
		{"hibernate an unknown host", []string{"hibernate", "nope.example.com", "--on"}, 1, "no route for host nope.example.com"},
		{"restore an unknown host", []string{"restore", "nope.example.com", "--at", "1"}, 1, "no route for host nope.example.com"},
		// Before "the mesh is off": the host is what is wrong.
		{"relocate an unknown host", []string{"relocate", "nope.example.com", "--to", "eu"}, 1, "no route for host nope.example.com"},
		{"delegate an unknown host", []string{"delegate", "nope.example.com", "--to", "partner"}, 1, "no route for host nope.example.com"},
		{"reclaim an unknown host", []string{"reclaim", "nope.example.com"}, 1, "no route for host nope.example.com"},
		{"wake a live route", []string{"wake", "live.example.com"}, 1, "live.example.com is a live route: it has no space to wake"},
		{"sleep a space that is not awake", []string{"sleep", "op.example.com"}, 1, "op.example.com is not awake on this box"},
		{"--off without an upstream", []string{"hibernate", "op.example.com", "--off"}, 4, "--off needs --upstream <addr>: op.example.com has no upstream to serve it live"},
		{"--upstream with --on", []string{"hibernate", "op.example.com", "--on", "--upstream", "127.0.0.1:1"}, 4, "--upstream goes with --off"},
		{"a bad host", []string{"wake", "BAD_HOST"}, 4, `host "BAD_HOST" must be lowercase`},
		{"a bad --home-region", []string{"add-instance", "hr.example.com", "--kind", "demo", "--home-region", "BAD"}, 4, `--home-region: region "BAD" contains 'B'`},
		{"no host", []string{"sleep"}, 4, "accepts 1 arg(s), received 0 (usage: lchat-caddy sleep <host>"},
		{"two hosts", []string{"status", "a.example.com", "b.example.com"}, 4, "accepts between 0 and 1 arg(s), received 2"},
	} {
		plainErrorLine(t, c.what, b.CLIRun(c.args...), c.code, c.want)
	}

	// The loop itself: asleep, woken, awake, put to sleep, asleep with a checkpoint.
	state := func() string {
		t.Helper()
		r := b.CLIRun("status", "op.example.com")
		lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		if r.Code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "HOST") {
			t.Fatalf("status: exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
		}
		return lines[1]
	}
	if s := state(); !strings.Contains(s, " asleep ") {
		t.Errorf("status before any request: %q, want asleep", s)
	}
	if r := b.CLIRun("wake", "op.example.com"); r.Code != 0 {
		t.Fatalf("wake: exit %d: %s", r.Code, r.Stderr)
	}
	if s := state(); !strings.Contains(s, " awake ") {
		t.Errorf("status after wake: %q, want awake", s)
	}
	if r := b.CLIRun("routes"); !strings.Contains(r.Stdout, "STATE") || !strings.Contains(r.Stdout, " awake ") {
		t.Errorf("routes after wake: %q, want a STATE column saying awake", r.Stdout)
	}
	// Restoring an awake space is refused with the command that makes it possible.
	plainErrorLine(t, "restore an awake space", b.CLIRun("restore", "op.example.com", "--at", "1"), 1,
		"op.example.com is awake on this box: put it to sleep first (lchat-caddy sleep op.example.com), then restore")
	if r := b.CLIRun("sleep", "op.example.com"); r.Code != 0 {
		t.Fatalf("sleep: exit %d: %s", r.Code, r.Stderr)
	}
	if s := state(); !strings.Contains(s, " asleep ") || !strings.Contains(s, "(gen ") {
		t.Errorf("status after sleep: %q, want asleep with its checkpoint", s)
	}
}

// `lchat-caddy version` names the lchat build beside Caddy's; help points at our docs.
func TestVersionAndHelpAreOurs(t *testing.T) {
	r := harness.RunCLI(t, "", nil, "version")
	if r.Code != 0 || !strings.HasPrefix(r.Stdout, "lchat-caddy ") || !strings.Contains(r.Stdout, ", Caddy v2.") {
		t.Errorf("version: exit %d, %q: want the lchat build, then Caddy's version", r.Code, r.Stdout)
	}
	for _, args := range [][]string{nil, {"help"}, {"--help"}, {"status", "--help"}, {"help", "sleep"}} {
		r := harness.RunCLI(t, "", nil, args...)
		if r.Code != 0 || !strings.Contains(r.Stdout, "docs/cli.md") || strings.Contains(r.Stdout, "Full documentation is available at") ||
			strings.Contains(r.Stdout, "$ caddy run") {
			t.Errorf("lchat-caddy %q: exit %d, help ends %q: want our docs, not Caddy's footer or examples", args, r.Code, tail(r.Stdout))
		}
	}
}

func tail(s string) string {
	if len(s) > 300 {
		return "..." + s[len(s)-300:]
	}
	return s
}

// bucket-check checks and leaves nothing: a missing directory is refused, not created,
// and an existing one keeps nothing of the check (no scratch keys, no lock files).
func TestBucketCheckLeavesNothing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no", "such", "dir")
	r := harness.RunCLI(t, "", nil, "bucket-check", "--bucket", "file://"+missing)
	plainErrorLine(t, "a missing directory", r, 1, "--bucket file://"+missing+": directory "+missing+" does not exist")
	if _, err := os.Stat(filepath.Dir(filepath.Dir(missing)) + "/no"); err == nil {
		t.Errorf("bucket-check created %s", missing)
	}

	dir := t.TempDir()
	r = harness.RunCLI(t, "", nil, "bucket-check", "--bucket", "file://"+dir, "--rounds", "1", "--racers", "4")
	if r.Code != 0 || !strings.Contains(r.Stdout, "OK:") {
		t.Fatalf("bucket-check: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("bucket-check left %v in %s", left, dir)
	}

	made := filepath.Join(t.TempDir(), "new")
	r = harness.RunCLI(t, "", nil, "bucket-check", "--bucket", "file://"+made, "--create", "--rounds", "1", "--racers", "4")
	if r.Code != 0 || !strings.Contains(r.Stdout, "created "+made+" (--create)") {
		t.Fatalf("bucket-check --create: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	if left, err := os.ReadDir(made); err != nil || len(left) != 0 {
		t.Errorf("bucket-check --create left %v in %s (%v), want the empty directory", left, made, err)
	}
}

// bucket-check without credentials says so in one line, naming where the AWS chain looked,
// with no line of the SDK's own (such as its "falling back to IMDSv1" warning).
func TestBucketCheckWithoutCredentials(t *testing.T) {
	// RunCLI's environment has no AWS variable and a HOME of its own (no ~/.aws); the
	// instance metadata service is off, as off EC2, so the chain ends at once.
	r := harness.RunCLI(t, "", []string{"AWS_EC2_METADATA_DISABLED=true"}, "bucket-check", "--bucket", "lchat-no-such-bucket", "--region", "us-east-1")
	plainErrorLine(t, "no credentials", r, 1, "no AWS credentials: the chain looked at $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY, the profile $AWS_PROFILE")
	for _, want := range []string{"~/.aws/credentials", "$AWS_WEB_IDENTITY_TOKEN_FILE", "$AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "instance metadata service"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("the error does not say the chain looked at %s: %q", want, r.Stderr)
		}
	}
	if strings.Contains(r.Stdout+r.Stderr, "IMDSv1") || r.Stdout != "" {
		t.Errorf("bucket-check printed more than its error: stdout %q, stderr %q", r.Stdout, r.Stderr)
	}
}
