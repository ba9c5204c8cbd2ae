package deploy

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/modules/lchatcli"
	"github.com/lchat/lchat-caddy/sandbox"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// The checks here need no VM and run in CI; TestDeployVM runs the same files for real.

// installDestdir runs install.sh with DESTDIR (no user, no systemctl) and answers DESTDIR.
func installDestdir(t *testing.T, bin string) string {
	dest := t.TempDir()
	cmd := exec.Command(filepath.Join(harness.RepoRoot(), "deploy", "systemd", "install.sh"), bin, "single")
	cmd.Env = append(os.Environ(), "DESTDIR="+dest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install.sh with DESTDIR: %v\n%s", err, out)
	}
	return dest
}

// unitSettings parses the [Service] section of a unit file: every value of each key,
// in order (a key may repeat, as SystemCallFilter does).
func unitSettings(t *testing.T, path string) map[string][]string {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' {
			continue
		}
		if l[0] == '[' {
			section = l
			continue
		}
		if k, v, ok := strings.Cut(l, "="); ok && section == "[Service]" {
			m[k] = append(m[k], v)
		}
	}
	return m
}

// The installed Caddyfile adapts with every choice docs/certificates.md offers (both DNS providers,
// both certificate caches): install.sh put every snippet it imports beside it.
func TestInstalledCaddyfileAdapts(t *testing.T) {
	bin := harness.Binary(t)
	dest := installDestdir(t, bin)
	caddyfile := filepath.Join(dest, "etc", "lchat-caddy", "Caddyfile")
	for _, want := range []string{"usr/local/bin/lchat-caddy", "usr/local/bin/lchat-pageread", "etc/systemd/system/lchat-caddy.service"} {
		if _, err := os.Stat(filepath.Join(dest, want)); err != nil {
			t.Errorf("install.sh did not install /%s: %v", want, err)
		}
	}
	for _, dns := range []string{"dnsimple", "route53"} {
		for _, cache := range []string{"local", "s3"} {
			cmd := exec.Command(bin, "adapt", "--config", caddyfile, "--adapter", "caddyfile")
			cmd.Env = append(os.Environ(), "LCHAT_DNS_PROVIDER="+dns, "LCHAT_CERT_CACHE="+cache,
				"LCHAT_WILDCARD_DOMAINS=example.com", "LCHAT_HIBERNATE_BUCKET=b")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("adapting the installed Caddyfile with LCHAT_DNS_PROVIDER=%s LCHAT_CERT_CACHE=%s: %v\n%s", dns, cache, err, out)
			}
		}
	}
}

// The shipped unit grants what the code checks for at start-up (the shipped Caddyfile's
// kinds are isolated with network egress) and puts the admin socket and the state where
// the CLI and the Caddyfile look for them.
func TestUnitGrantsWhatTheBoxNeeds(t *testing.T) {
	u := unitSettings(t, filepath.Join(harness.RepoRoot(), "deploy", "systemd", "lchat-caddy.service"))
	one := func(k string) string {
		if len(u[k]) != 1 {
			t.Errorf("%s= is set %d times, want once", k, len(u[k]))
			return ""
		}
		return u[k][0]
	}
	ambient := strings.Fields(one("AmbientCapabilities"))
	bounding := strings.Fields(one("CapabilityBoundingSet"))
	need := []string{"CAP_NET_BIND_SERVICE", sandbox.CapNetAdmin.String()}
	for _, c := range sandbox.IsolationCaps {
		need = append(need, c.String())
	}
	for _, c := range need {
		if !slices.Contains(ambient, c) {
			t.Errorf("AmbientCapabilities lacks %s, which the shipped Caddyfile's kinds need", c)
		}
	}
	slices.Sort(ambient)
	slices.Sort(bounding)
	if !slices.Equal(ambient, bounding) {
		t.Errorf("CapabilityBoundingSet %v differs from AmbientCapabilities %v", bounding, ambient)
	}
	for k, want := range map[string]string{
		"Delegate":             "yes",
		"ProtectControlGroups": "false",
		"KillSignal":           "SIGTERM",
		"User":                 "lchat",
		"StateDirectory":       "lchat-caddy",
		"StateDirectoryMode":   "0711",
		"RuntimeDirectory":     filepath.Base(filepath.Dir(lchatcli.DefaultAdminSocket)),
		"RuntimeDirectoryMode": "0700",
		"EnvironmentFile":      "/data/router.env",
		"Type":                 "notify",
		"ReadWritePaths":       "/var/lib/lchat-caddy",
	} {
		if got := one(k); got != want {
			t.Errorf("%s=%s, want %s", k, got, want)
		}
	}
	// Any RestrictNamespaces= makes systemd answer clone3 with ENOSYS, and the box starts
	// each isolated instance in its cgroup with clone3 (TestDeployVM found every wake
	// failing under it).
	if v, ok := u["RestrictNamespaces"]; ok {
		t.Errorf("RestrictNamespaces=%s: it filters clone3, which every isolated wake needs", v)
	}
	// Caddy sends READY=1 after a failed config load too; the start must wait for the
	// admin API instead (TestDeployVM: "systemctl restart" succeeded for a box that exited).
	if post := one("ExecStartPost"); !strings.Contains(post, "lchat-caddy routes >/dev/null") {
		t.Errorf("ExecStartPost=%s: want the admin API check, its output discarded (it lists every route's env)", post)
	}
	if exec := one("ExecStart"); !strings.Contains(exec, "--config /etc/lchat-caddy/Caddyfile") || strings.Contains(exec, "--environ") {
		t.Errorf("ExecStart=%s: want the installed Caddyfile, and never --environ (it prints the credentials)", exec)
	}
}

// systemd-analyze verify accepts the installed unit, where systemd-analyze exists. It
// checks that ExecStart's binary exists, so the copy it reads points at the one
// install.sh put under DESTDIR; nothing else in the unit is changed.
func TestUnitVerifies(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("no systemd-analyze")
	}
	// install.sh only copies the binaries: two stand-ins do.
	bins := t.TempDir()
	for _, name := range []string{"lchat-caddy", "lchat-pageread"} {
		if err := os.WriteFile(filepath.Join(bins, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dest := installDestdir(t, filepath.Join(bins, "lchat-caddy"))
	b, err := os.ReadFile(filepath.Join(dest, "etc", "systemd", "system", "lchat-caddy.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(t.TempDir(), "lchat-caddy.service")
	b = []byte(strings.ReplaceAll(string(b), "/usr/local/bin/lchat-caddy", filepath.Join(dest, "usr/local/bin/lchat-caddy")))
	if err := os.WriteFile(unit, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("systemd-analyze", "verify", "--man=no", unit)
	// verify exits 0 on an unknown key or system call group ("ignoring"): any output
	// is a finding.
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}
