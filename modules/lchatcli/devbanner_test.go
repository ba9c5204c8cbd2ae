package lchatcli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The host the banner suggests adding does not exist yet, on every run.
func TestFreeHost(t *testing.T) {
	for _, c := range []struct {
		have []string
		want string
	}{
		{nil, "chat.localhost"},
		{[]string{"demo.localhost"}, "chat.localhost"},
		{[]string{"chat.localhost"}, "chat2.localhost"},
		{[]string{"chat.localhost", "chat2.localhost", "chat3.localhost"}, "chat4.localhost"},
	} {
		exists := func(h string) bool {
			for _, x := range c.have {
				if x == h {
					return true
				}
			}
			return false
		}
		if got := freeHost(exists); got != c.want {
			t.Errorf("with %v: %s, want %s", c.have, got, c.want)
		}
	}
}

// dev's logs: console in a terminal, JSON otherwise or when asked; a bad level or format
// is a usage error naming its flag.
func TestDevLogs(t *testing.T) {
	for _, c := range []struct {
		level, format string
		terminal      bool
		want          DevLogs
		err           string
	}{
		{"warn", "auto", true, DevLogs{"warn", "console"}, ""},
		{"warn", "auto", false, DevLogs{"warn", "json"}, ""},
		{"INFO", "json", true, DevLogs{"info", "json"}, ""},
		{"loud", "auto", true, DevLogs{}, `--log-level "loud"`},
		{"info", "xml", true, DevLogs{}, `--log-format "xml"`},
	} {
		got, err := devLogs(c.level, c.format, c.terminal)
		if c.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), c.err) {
				t.Errorf("%s/%s: error %v, want one starting %q", c.level, c.format, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s/%s/%t: %+v, %v; want %+v", c.level, c.format, c.terminal, got, err, c.want)
		}
	}
	// The admin API's request lines show at debug only.
	for level, admin := range map[string]string{"debug": "debug", "info": "warn", "warn": "warn", "error": "error"} {
		logs := DevLogs{level, "json"}.config()["logs"].(map[string]any)
		if got := logs["admin"].(map[string]any)["level"]; got != admin {
			t.Errorf("at --log-level %s the admin API logs at %v, want %s", level, got, admin)
		}
	}
}

// Run through go run, the banner says what go does to exit codes.
func TestDevBannerSaysWhatGoRunDoes(t *testing.T) {
	var b strings.Builder
	devBanner(&b, banner{Self: "go run ./cmd/lchat-caddy", GoRun: true, Dir: "/d", Port: "8080", Admin: "localhost:2019", Suggest: "chat2.localhost"})
	out := b.String()
	for _, want := range []string{
		"go run ./cmd/lchat-caddy add-instance chat2.localhost --kind demo --address localhost:2019",
		`"exit status N" and exits 1`,
		"scripts/build && bin/lchat-caddy dev",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("banner lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasSuffix(strings.TrimSpace(out), "Ctrl-C saves every awake space to the bucket and exits.") {
		t.Errorf("banner does not end with the Ctrl-C line:\n%s", out)
	}
}

// Below the banner, a note for a missing lchat-demo-space only: a missing lchat-pageread
// turns the demo space's isolation off, which the banner's first lines say, naming it.
func TestMissingHelpers(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "lchat-caddy")
	notes := missingHelpers(exe)
	if len(notes) != 1 || !strings.HasPrefix(notes[0], "Slower wakes: lchat-demo-space is not beside this binary") {
		t.Fatalf("beside nothing: %q, want the one lchat-demo-space note", notes)
	}
	if err := os.WriteFile(filepath.Join(dir, "lchat-demo-space"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if notes := missingHelpers(exe); len(notes) != 0 {
		t.Fatalf("beside lchat-demo-space (no lchat-pageread): %q, want no note", notes)
	}
}
