package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/spacestore/pageread/pagereadtest"
)

// TestInstanceEnvHome: HOME is the space's data dir, unless the kind's env names another;
// a route cannot set it.
func TestInstanceEnvHome(t *testing.T) {
	last := func(env []string) map[string]string {
		m := map[string]string{}
		for _, kv := range env {
			n, v, _ := strings.Cut(kv, "=")
			m[n] = v // exec uses the last value of a duplicated name
		}
		return m
	}
	sp := Space{Host: "h.test", Env: map[string]string{"HOME": "/evil"}}
	env, _ := instanceEnv(Kind{AllowedEnv: []string{"HOME"}}, sp, "/run/s.sock", "/run/c.sock", "/data/h")
	if got := last(env)["HOME"]; got != "/data/h" {
		t.Errorf("HOME = %q, want the data dir", got)
	}
	env, _ = instanceEnv(Kind{Env: map[string]string{"HOME": "/srv/app"}}, sp, "/run/s.sock", "/run/c.sock", "/data/h")
	if got := last(env)["HOME"]; got != "/srv/app" {
		t.Errorf("HOME = %q, want the kind's", got)
	}
}

// TestIsolatedInstanceHasAHomeOfItsOwn: an isolated instance, under its own uid, finds
// HOME set to its own data dir, and can write there; two spaces never share one.
func TestIsolatedInstanceHasAHomeOfItsOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	dir, inst := reachableInstance(t, "home")
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The shell writes what it sees before it becomes the instance.
	kind := Kind{
		Command: "/bin/sh",
		Args: []string{"-c", `printf '%s' "$HOME" > "$LCHAT_DATA_DIR/home.txt" && printf '%s' "$(id -u)" > "$HOME/.written" && exec "$0"`,
			inst},
		Env:         map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
		Replication: Replication{Class: ReplicateSleep},
		StopGrace:   5 * time.Second,
		Isolation:   IsolationOn,
		Network:     NetworkHost,
	}
	e, err := New(Config{Bucket: b, StateDir: filepath.Join(dir, "state"), Holder: "box", Incarnation: "1",
		Kinds: map[string]Kind{"app": kind}, UIDFirst: 3200400, UIDCount: 100, PageReader: pagereadtest.Binary(t)})
	if err != nil {
		t.Fatal(err)
	}
	drainAtEnd(t, e)
	homes := map[string]bool{}
	for _, host := range []string{"home-a.example.com", "home-b.example.com"} {
		u, err := e.Acquire(context.Background(), Space{Host: host, Kind: "app"})
		if err != nil {
			t.Fatalf("waking %s: %v", host, err)
		}
		u.Release()
		data := filepath.Join(dir, "state", "spaces", host, "data")
		home, err := os.ReadFile(filepath.Join(data, "home.txt"))
		if err != nil || string(home) != data {
			t.Fatalf("%s: the instance saw HOME %q (%v), want its data dir %s", host, home, err, data)
		}
		homes[string(home)] = true
		written := filepath.Join(data, ".written")
		uid, err := os.ReadFile(written)
		if err != nil {
			t.Fatalf("%s: the instance could not write in its HOME: %v", host, err)
		}
		fi, _ := os.Stat(written)
		if owner := fi.Sys().(*syscall.Stat_t).Uid; string(uid) == "0" || uid == nil || owner < 3200400 || owner >= 3200500 {
			t.Fatalf("%s: HOME written by uid %s (file owned by %d), want the space's own", host, uid, owner)
		}
	}
	if len(homes) != 2 {
		t.Fatalf("two spaces share a HOME: %v", homes)
	}
}
