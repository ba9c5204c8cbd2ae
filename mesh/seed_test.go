package mesh

import (
	"errors"
	"testing"
)

func hosts(rows []RouteRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Host
	}
	return out
}

func TestPlan(t *testing.T) {
	row := func(h, region string) RouteRow {
		return RouteRow{Host: h, Kind: "chat", Hibernate: true, HomeRegion: region}
	}
	local := []RouteRow{
		row("b.example.com", ""),
		row("A.example.com", ""),
		row("x.other.net", "fi"),      // outside the domains, pinned to fi
		row("y.other.net", ""),        // outside the domains
		row("deep.a.example.com", ""), // two labels down: out of scope
	}
	peer := []RouteRow{
		row("a.example.com", ""),
		row("gone.example.com", ""),   // in scope, missing here: tombstoned with prune
		row("z.other.net", "fi"),      // pinned to fi, missing here: tombstoned with --region fi
		row("keep.unrelated.org", ""), // the peer's own business: never touched
		row("y.other.net", ""),        // present here, out of scope: left alone
	}
	for _, tc := range []struct {
		name       string
		local      []RouteRow
		opts       PlanOptions
		puts, tomb []string
		err        error
	}{
		{name: "domains", local: local, opts: PlanOptions{Domains: []string{"example.com"}},
			puts: []string{"a.example.com", "b.example.com"}},
		{name: "region adds pinned rows", local: local, opts: PlanOptions{Domains: []string{"example.com"}, Region: "fi"},
			puts: []string{"a.example.com", "b.example.com", "x.other.net"}},
		{name: "prune", local: local, opts: PlanOptions{Domains: []string{"example.com"}, Prune: true},
			puts: []string{"a.example.com", "b.example.com"}, tomb: []string{"gone.example.com"}},
		{name: "prune with region", local: local, opts: PlanOptions{Domains: []string{"example.com"}, Region: "fi", Prune: true},
			puts: []string{"a.example.com", "b.example.com", "x.other.net"}, tomb: []string{"gone.example.com", "z.other.net"}},
		{name: "zero-source guard", local: []RouteRow{row("y.other.net", "")}, opts: PlanOptions{Domains: []string{"example.com"}, Prune: true},
			err: ErrEmptySource},
		{name: "empty source without prune is harmless", local: nil, opts: PlanOptions{Domains: []string{"example.com"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			puts, tomb, err := Plan(tc.local, peer, tc.opts)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if err != nil && (puts != nil || tomb != nil) {
				t.Fatal("a refused plan still planned work")
			}
			var tombHosts []string
			for _, tb := range tomb {
				tombHosts = append(tombHosts, tb.Host)
			}
			if !sameStrings(hosts(puts), tc.puts) || !sameStrings(tombHosts, tc.tomb) {
				t.Fatalf("puts %v tombstones %v, want %v and %v", hosts(puts), tomb, tc.puts, tc.tomb)
			}
		})
	}
}
