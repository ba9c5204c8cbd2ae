package lifecycle

import (
	"slices"
	"testing"
)

var all = []State{Starting, Serving, Fenced, Draining, DrainingFenced, Closed}

func TestTransitions(t *testing.T) {
	want := map[[2]State]bool{
		{Starting, Serving}: true, {Starting, DrainingFenced}: true, {Starting, Closed}: true,
		{Serving, Fenced}: true, {Serving, Draining}: true, {Serving, Closed}: true,
		{Fenced, Serving}: true, {Fenced, DrainingFenced}: true, {Fenced, Closed}: true,
		{Draining, DrainingFenced}: true, {Draining, Closed}: true,
		{DrainingFenced, Draining}: true, {DrainingFenced, Closed}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if got := Allowed(from, to); got != want[[2]State{from, to}] {
				t.Errorf("%s -> %s allowed = %v", from, to, got)
			}
		}
	}
}

// TestDoors: each door moves the machine as the table says from every state it can be
// in, reports whether it changed what its callers read, and tells the fence's observers
// exactly when being fenced changes.
func TestDoors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		path    func(m *Machine)
		want    State
		fenced  bool
		drain   bool
		notices []bool // what OnFence heard
	}{
		{"new", func(m *Machine) {}, Starting, true, false, nil},
		{"first beat", func(m *Machine) { m.Fence(false) }, Serving, false, false, []bool{false}},
		{"beats fail", func(m *Machine) { m.Fence(false); m.Fence(true) }, Fenced, true, false, []bool{false, true}},
		{"fence twice", func(m *Machine) { m.Fence(false); m.Fence(true); m.Fence(true) }, Fenced, true, false, []bool{false, true}},
		{"lifted", func(m *Machine) { m.Fence(false); m.Fence(true); m.Fence(false) }, Serving, false, false, []bool{false, true, false}},
		{"drain", func(m *Machine) { m.Fence(false); m.Drain() }, Draining, false, true, []bool{false}},
		{"drain before any beat", func(m *Machine) { m.Drain() }, DrainingFenced, true, true, nil},
		{"fenced while draining", func(m *Machine) { m.Fence(false); m.Drain(); m.Fence(true) }, DrainingFenced, true, true, []bool{false, true}},
		{"drain fenced, then a beat", func(m *Machine) { m.Fence(false); m.Fence(true); m.Drain(); m.Fence(false) }, Draining, false, true, []bool{false, true, false}},
		{"drain twice", func(m *Machine) { m.Fence(false); m.Drain(); m.Drain() }, Draining, false, true, []bool{false}},
		{"closed", func(m *Machine) { m.Fence(false); m.Drain(); m.Close() }, Closed, false, true, []bool{false}},
		{"closed stays", func(m *Machine) { m.Close(); m.Fence(false); m.Drain() }, Closed, false, true, nil},
	} {
		m := New()
		var heard []bool
		m.OnFence(func(f bool) { heard = append(heard, f) })
		tc.path(m)
		if got := m.State(); got != tc.want || m.Fenced() != tc.fenced || m.Draining() != tc.drain {
			t.Errorf("%s: %s fenced %v draining %v, want %s %v %v", tc.name, got, m.Fenced(), m.Draining(), tc.want, tc.fenced, tc.drain)
		}
		if !slices.Equal(heard, tc.notices) {
			t.Errorf("%s: observers heard %v, want %v", tc.name, heard, tc.notices)
		}
	}
}
