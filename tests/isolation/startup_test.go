package isolation

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// runPlain starts lchat-caddy with caddyfile and env as the given command prefix (e.g.
// setpriv to drop root) in a directory of its own, and returns its output and a channel
// that receives its exit. It is killed when the test ends.
func runPlain(t *testing.T, prefix []string, caddyfile string, env ...string) (*harness.SyncBuffer, <-chan error) {
	t.Helper()
	dir, err := os.MkdirTemp("", "start")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o777)
	cf := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cf, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{}, prefix...), harness.Binary(t), "run", "--config", cf, "--adapter", "caddyfile")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DIR="+dir, "HTTP_PORT="+harness.FreePort(t, "127.0.0.1"), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	cmd.Env = append(cmd.Env, env...)
	out := new(harness.SyncBuffer)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done, exited := make(chan error, 1), make(chan struct{})
	go func() { done <- cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	return out, done
}

// refusedAtStart runs lchat-caddy as runPlain does, expects it to exit non-zero on its
// own, and returns its output.
func refusedAtStart(t *testing.T, prefix []string, caddyfile string, env ...string) string {
	t.Helper()
	out, done := runPlain(t, prefix, caddyfile, env...)
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("lchat-caddy exited 0; want a refusal:\n%s", out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("lchat-caddy started; want a refusal:\n%s", out.String())
	}
	return out.String()
}

// oneKind is the config of a box whose one kind, app, runs /bin/true with lines added.
func oneKind(lines ...string) string {
	var k strings.Builder
	for _, l := range lines {
		k.WriteString("\t\t\t" + l + "\n")
	}
	return `{
	admin off
	http_port {$HTTP_PORT}
	lchat {
		bucket file {$DIR}/bucket
		state_dir {$DIR}/state
		registry {$DIR}/registry.db
		kind app {
			command /bin/true
` + k.String() + `		}
	}
}
http:// {
	lchat
}
`
}

// unprivileged is the command prefix of a box that is not root: another uid, no
// capabilities at all.
func unprivileged(t *testing.T) []string {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv")
	}
	return []string{setpriv, "--reuid=3999980", "--regid=3999980", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"}
}

func TestShortMeshTokenRefusedAtStart(t *testing.T) {
	const short = "short-but-not-empty-token-31chr"
	out := refusedAtStart(t, nil, `{
	admin off
	http_port {$HTTP_PORT}
	lchat {
		bucket file {$DIR}/bucket
		state_dir {$DIR}/state
		registry {$DIR}/registry.db
	}
}
http:// {
	lchat
}
`, mesh.EnvSelf+"=https://box-1.example.net", mesh.EnvDomains+"=example.com", mesh.EnvToken+"="+short)
	if !strings.Contains(out, mesh.EnvToken) || !strings.Contains(out, "32") {
		t.Errorf("the refusal does not name %s and the 32-character rule:\n%s", mesh.EnvToken, out)
	}
	if strings.Contains(out, short) {
		t.Error("the refusal prints the token")
	}

	// mesh-token prints one that is accepted.
	tok, err := exec.Command(harness.Binary(t), "mesh-token").Output()
	if err != nil {
		t.Fatal(err)
	}
	if err := mesh.CheckToken(strings.TrimSpace(string(tok))); err != nil {
		t.Errorf("mesh-token printed a token the box refuses: %v", err)
	}
}

// A box that cannot switch uids refuses a kind that asks for isolation, naming every
// capability it lacks and the opt-out.
func TestBoxWithoutCapabilitiesRefusesIsolation(t *testing.T) {
	needRoot(t)
	drop := unprivileged(t)
	cf := oneKind("isolation on")
	out := refusedAtStart(t, drop, cf)
	for _, c := range []string{"CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "isolation none"} {
		if !strings.Contains(out, c) {
			t.Errorf("the refusal does not name %s:\n%s", c, out)
		}
	}
}

// A box without CAP_NET_ADMIN refuses a kind that asks for network egress, and one
// without CAP_SYS_ADMIN a kind that asks for network none, naming the capability and the
// opt-out. The box stays root (isolation works) with just that capability dropped.
func TestBoxWithoutCapabilitiesRefusesNetworkConfinement(t *testing.T) {
	needRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv")
	}
	for mode, c := range map[string]string{"egress": "net_admin", "none": "sys_admin"} {
		t.Run(mode, func(t *testing.T) {
			drop := []string{setpriv, "--bounding-set=-" + c, "--inh-caps=-" + c}
			out := refusedAtStart(t, drop, oneKind("isolation on", "network "+mode))
			want := "CAP_" + strings.ToUpper(c)
			if !strings.Contains(out, "network "+mode+" needs "+want) {
				t.Errorf("the refusal does not say network %s needs %s:\n%s", mode, want, out)
			}
			if !strings.Contains(out, "set network ") {
				t.Errorf("the refusal does not name the opt-out:\n%s", out)
			}
		})
	}
}

// A developer's box (not root, no capabilities) with a kind that sets neither isolation
// nor network starts, and its log says the kind's network is the box's own, and why.
func TestUnprivilegedBoxRunsWithNetworkHostAndSaysSo(t *testing.T) {
	needRoot(t)
	out, done := runPlain(t, unprivileged(t), oneKind())
	harness.WaitFor(t, 60*time.Second, "the kind's isolation logged", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the unprivileged box exited (%v):\n%s", err, out.String())
		default:
		}
		return strings.Contains(out.String(), `"msg":"kind isolation"`)
	})
	if !logSays(out.String(), "kind isolation", map[string]string{"kind": "app", "network": "host"}) ||
		!strings.Contains(out.String(), `"network_why_not_egress":"the kind is not isolated: isolation needs CAP_SETUID`) {
		t.Errorf("the box's log does not say the kind runs with network host because it is not isolated:\n%s", out.String())
	}
	if !strings.Contains(out.String(), `"private_tmp":false,"tmp_why_not_private":"the kind is not isolated: isolation needs CAP_SETUID`) {
		t.Errorf("the box's log does not say the kind shares the box's /tmp because it is not isolated:\n%s", out.String())
	}
}

// A root box without CAP_SYS_ADMIN refuses a kind that asks for a disk or a private /tmp,
// naming the capability; a kind that sets no tmp starts with the box's /tmp and says why.
func TestBoxWithoutSysAdminRefusesDiskAndPrivateTmp(t *testing.T) {
	needRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv")
	}
	drop := []string{setpriv, "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"}
	for name, c := range map[string]struct {
		lines []string
		want  string
	}{
		"disk":        {[]string{"isolation on", "limits {", "\tdisk 32MiB", "}"}, "limits.disk needs CAP_SYS_ADMIN"},
		"tmp private": {[]string{"isolation on", "tmp private"}, "a private /tmp needs CAP_SYS_ADMIN"},
	} {
		t.Run(name, func(t *testing.T) {
			if out := refusedAtStart(t, drop, oneKind(c.lines...)); !strings.Contains(out, c.want) {
				t.Errorf("the refusal does not say %q:\n%s", c.want, out)
			}
		})
	}
	out, done := runPlain(t, drop, oneKind("isolation on", "network host"))
	harness.WaitFor(t, 60*time.Second, "the kind's isolation logged", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the box exited (%v):\n%s", err, out.String())
		default:
		}
		return strings.Contains(out.String(), `"msg":"kind isolation"`)
	})
	if !strings.Contains(out.String(), `"private_tmp":false,"tmp_why_not_private":"a private /tmp needs CAP_SYS_ADMIN`) {
		t.Errorf("the box's log does not say the kind shares the box's /tmp for want of CAP_SYS_ADMIN:\n%s", out.String())
	}
}

// A box without CAP_SYS_ADMIN refuses an isolated kind that asks for socket activation:
// its instances must be pid 1 of a PID namespace under the space's uid, which the
// unprivileged user namespace it could fall back to cannot give. The refusal names the
// capability and the way out.
func TestBoxWithoutSysAdminRefusesIsolatedSocketActivation(t *testing.T) {
	needRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv")
	}
	drop := []string{setpriv, "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"}
	out := refusedAtStart(t, drop, oneKind("isolation on", "network host", "socket_activation on"))
	if !strings.Contains(out, "socket_activation: an isolated kind needs CAP_SYS_ADMIN") || !strings.Contains(out, "isolation none") {
		t.Errorf("the refusal does not say socket activation of an isolated kind needs CAP_SYS_ADMIN:\n%s", out)
	}
}
