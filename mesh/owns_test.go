package mesh

import (
	"testing"

	"github.com/lchat/lchat-caddy/registry"
)

func TestFiresWakeRoute(t *testing.T) {
	members := []Member{{Self: "https://a.mesh.test", Region: "fi"}, {Self: "https://b.mesh.test", Region: "fi"}}
	b := testBox(members...)
	mine := hostOwnedBy(t, members, "https://a.mesh.test")
	theirs := hostOwnedBy(t, members, "https://b.mesh.test")
	routes := map[string]*registry.Route{
		mine:          {Host: mine},
		theirs:        {Host: theirs},
		"x.other.net": {Host: "x.other.net"},
	}
	lookup := func(h string) (*registry.Route, bool) { rt, ok := routes[h]; return rt, ok }
	for _, tc := range []struct {
		host string
		want bool
	}{
		{mine, true},
		{theirs, false},
		{"x.other.net", true}, // outside the mesh domains: this box's own
		{"gone.mesh.test", false},
		{"gone.other.net", false}, // no route: nobody's, even outside the mesh
	} {
		if got := b.FiresWakeRoute(lookup, tc.host, 0); got != tc.want {
			t.Errorf("FiresWakeRoute(%s) = %v, want %v", tc.host, got, tc.want)
		}
	}
}
