package box_test

import (
	"context"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/box/boxtest"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/registry"
)

func kindNames(b *box.Box) []string {
	var names []string
	for n := range b.Engine().Kinds() {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// TestSettingsFollowTheStartedConfig: a config's settings (its kinds, what route changes
// use) are the box's from its Start on; the Stop of a config whose start is unwound puts
// the ones before back, the Stop of a config a newer one replaced changes nothing, and
// neither does a config that never started. Route changes from every door check against
// the settings in effect.
func TestSettingsFollowTheStartedConfig(t *testing.T) {
	kind := func(name string) map[string]engine.Kind {
		return map[string]engine.Kind{name: {Name: name, Command: "/bin/true"}}
	}
	old := &box.Settings{Kinds: kind("old")}
	b := boxtest.Open(t, boxtest.Options{Settings: *old})
	old = b.Settings()
	create := func(kind string) int {
		_, err := b.Create(context.Background(), registry.Spec{Host: kind + ".example.com", Kind: kind})
		if err != nil {
			return box.StatusOf(err)
		}
		return http.StatusCreated
	}

	unwound := &box.Settings{Kinds: kind("new")}
	if err := b.Start(unwound); err != nil {
		t.Fatal(err)
	}
	if got := kindNames(b); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("kinds after the start: %v", got)
	}
	if ok, err := b.Stop(unwound); !ok || err != nil {
		t.Fatalf("Stop of the newest config: unwound %v, %v", ok, err)
	}
	if got := kindNames(b); !slices.Equal(got, []string{"old"}) || b.Settings() != old {
		t.Fatalf("after the unwind: kinds %v, settings put back %v", got, b.Settings() == old)
	}
	if create("new") != http.StatusBadRequest || create("old") != http.StatusCreated {
		t.Fatalf("creates after the unwind do not check against the old config's kinds")
	}

	next := &box.Settings{Kinds: kind("new")}
	if err := b.Start(next); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Stop(old); ok || err != nil {
		t.Fatalf("Stop of the replaced config: unwound %v, %v", ok, err)
	}
	if ok, _ := b.Stop(&box.Settings{Kinds: kind("never")}); ok {
		t.Fatal("Stop of a config that never started unwound something")
	}
	if got := kindNames(b); !slices.Equal(got, []string{"new"}) || b.Settings() != next {
		t.Fatalf("kinds after the old config stopped: %v", got)
	}
	// The replacement is final: the newest config's own stop (at exit) puts nothing back.
	if ok, _ := b.Stop(next); ok || b.Settings() != next {
		t.Fatal("the Stop of a config whose predecessor had stopped put that predecessor back")
	}
	if err := b.Start(&box.Settings{Kinds: map[string]engine.Kind{"Bad": {Command: "/bin/true"}}}); err == nil || b.Settings() != next {
		t.Fatalf("a config whose kinds the engine refuses started: %v", err)
	}
}

// TestFleet: the fleet is every live box, this one read from memory with the counters
// its peers would read from its status document, a peer that cannot be read listed with
// the error from its heartbeat; without the mesh, this box alone.
func TestFleet(t *testing.T) {
	b, _ := boxtest.MeshBox(t)
	f := b.Fleet(context.Background())
	if !f.Mesh || f.Self != boxtest.SelfA || len(f.Boxes) != 2 {
		t.Fatalf("fleet = %+v, want both boxes", f)
	}
	for _, m := range f.Boxes {
		switch m.Self {
		case boxtest.SelfA:
			if !m.This || m.Error != "" || m.Counters == nil || !maps(m.Counters, "forwards", "wakes", "oom_kills") {
				t.Errorf("this box: %+v, want its mesh and engine counters", m)
			}
		case boxtest.SelfB:
			if m.This || m.Error == "" {
				t.Errorf("unreachable peer: %+v, want an error", m)
			}
		}
	}
	alone := boxtest.Open(t, boxtest.Options{}).Fleet(context.Background())
	if alone.Mesh || len(alone.Boxes) != 1 || !alone.Boxes[0].This {
		t.Fatalf("fleet without the mesh = %+v", alone)
	}
}

func maps(m map[string]uint64, names ...string) bool {
	for _, n := range names {
		if _, ok := m[n]; !ok {
			return false
		}
	}
	return true
}

// TestDrainOnExit: once the process says it is exiting, the box drains at once (its
// spaces saved and stopped), without waiting for Close.
func TestDrainOnExit(t *testing.T) {
	var exiting atomic.Bool
	b := boxtest.Open(t, boxtest.Options{Settings: box.Settings{Kinds: boxtest.InstanceKinds(t)}, Exiting: exiting.Load})
	const host = "exit.example.com"
	if _, err := b.Create(context.Background(), registry.Spec{Host: host, Kind: "demo"}); err != nil {
		t.Fatal(err)
	}
	boxtest.Wake(t, b, host)
	exiting.Store(true)
	deadline := time.Now().Add(20 * time.Second)
	for boxtest.Awake(b, host) {
		if time.Now().After(deadline) {
			t.Fatal("the space is still awake 20s after the process began exiting")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := b.Acquire(context.Background(), &registry.Route{Host: host, Kind: "demo", Hibernate: true}); err == nil {
		t.Fatal("a drained box woke a space")
	}
}
