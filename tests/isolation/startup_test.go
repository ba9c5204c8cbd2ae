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

// refusedAtStart runs lchat-caddy with caddyfile and env as the given command prefix
// (e.g. setpriv to drop root), expects it to exit non-zero on its own, and returns its
// output.
func refusedAtStart(t *testing.T, prefix []string, caddyfile string, env ...string) string {
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
	var out harness.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("lchat-caddy exited 0; want a refusal:\n%s", out.String())
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("lchat-caddy started; want a refusal:\n%s", out.String())
	}
	return out.String()
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
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv")
	}
	// An unprivileged box: another uid, no capabilities at all.
	drop := []string{setpriv, "--reuid=3999980", "--regid=3999980", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"}
	cf := `{
	admin off
	http_port {$HTTP_PORT}
	lchat {
		bucket file {$DIR}/bucket
		state_dir {$DIR}/state
		registry {$DIR}/registry.db
		kind app {
			command /bin/true
			isolation on
		}
	}
}
http:// {
	lchat
}
`
	out := refusedAtStart(t, drop, cf)
	for _, c := range []string{"CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "isolation none"} {
		if !strings.Contains(out, c) {
			t.Errorf("the refusal does not name %s:\n%s", c, out)
		}
	}
}
