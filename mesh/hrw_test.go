package mesh

import (
	"fmt"
	"hash/fnv"
	"math/bits"
	"testing"
)

// TestScoreStable pins the hash: every box of every version must agree on placement, so
// a change here is a fleet-wide reshuffle and must be deliberate. The values were
// computed independently (a Python rendering of FNV-1a 64 over self+"\x00"+host and the
// splitmix64 finalizer), and the test also recomputes them with the standard library.
func TestScoreStable(t *testing.T) {
	for _, tc := range []struct {
		self, host string
		want       uint64
	}{
		{"https://box-1.example.net", "8oe.example.com", 0x0363c4255c1a7ca0},
		{"https://box-2.example.net", "8oe.example.com", 0xf6a726bc8d320726},
		{"http://10.0.0.5", "a.11ch.example.com", 0x34e358e5ab75f1c4},
	} {
		if got := Score(tc.self, tc.host); got != tc.want {
			t.Errorf("Score(%q, %q) = %#x, want %#x", tc.self, tc.host, got, tc.want)
		}
		h := fnv.New64a()
		h.Write([]byte(tc.self + "\x00" + tc.host))
		if got := mix64(h.Sum64()); got != tc.want {
			t.Errorf("hash/fnv + splitmix64 = %#x, want %#x", got, tc.want)
		}
	}
}

// TestScoreMixes checks the avalanche the finalizer is there for: flipping one input
// character flips about half the output bits.
func TestScoreMixes(t *testing.T) {
	total, n := 0, 0
	for i := 0; i < 2000; i++ {
		a := Score("https://box-1.example.net", fmt.Sprintf("s%d.example.com", i))
		b := Score("https://box-1.example.net", fmt.Sprintf("s%d.example.con", i))
		c := Score("https://box-2.example.net", fmt.Sprintf("s%d.example.com", i))
		total += bits.OnesCount64(a^b) + bits.OnesCount64(a^c)
		n += 2
	}
	if avg := float64(total) / float64(n); avg < 30 || avg > 34 {
		t.Fatalf("average flipped bits %.2f, want about 32", avg)
	}
}

func TestOwner(t *testing.T) {
	ms := []Member{
		{Self: "https://a.example.net", Region: "ie"},
		{Self: "https://b.example.net", Region: "ie"},
		{Self: "https://c.example.net", Region: "fi"},
		{Self: "https://d.example.net"},
	}
	if _, ok := Owner("x.example.com", nil, ""); ok {
		t.Fatal("owner among no members")
	}
	counts := map[string]int{}
	for i := 0; i < 4000; i++ {
		host := fmt.Sprintf("s%d.example.com", i)
		all, _ := Owner(host, ms, "")
		counts[all.Self]++
		// The highest score wins.
		for _, m := range ms {
			if Score(m.Self, host) > Score(all.Self, host) {
				t.Fatalf("%s: %s outscores owner %s", host, m.Self, all.Self)
			}
		}
		// Case and port of the Host header do not matter.
		if o, _ := Owner("S"+host[1:]+":443", ms, ""); o.Self != all.Self {
			t.Fatalf("%s: owner depends on host spelling", host)
		}
		// Member order does not matter.
		rev := []Member{ms[3], ms[2], ms[1], ms[0]}
		if o, _ := Owner(host, rev, ""); o.Self != all.Self {
			t.Fatalf("%s: owner depends on member order", host)
		}
		ie, _ := Owner(host, ms, "ie")
		if ie.Region != "ie" {
			t.Fatalf("%s: home_region ie placed on %q", host, ie.Region)
		}
		fi, _ := Owner(host, ms, "fi")
		if fi.Self != "https://c.example.net" {
			t.Fatalf("%s: home_region fi placed on %s", host, fi.Self)
		}
		// No live box in the region: the whole fleet, not a stranded space.
		if o, _ := Owner(host, ms, "us"); o.Self != all.Self {
			t.Fatalf("%s: unserved region did not fall back to the fleet", host)
		}
	}
	for _, m := range ms {
		if c := counts[m.Self]; c < 800 || c > 1200 {
			t.Errorf("%s owns %d of 4000 hosts, want about 1000", m.Self, c)
		}
	}
}

// TestOwnerSkipsDraining: a draining member owns nothing (its hosts go where they would
// go without it), a region whose only member drains falls back to the fleet, and a fleet
// of draining members places nothing.
func TestOwnerSkipsDraining(t *testing.T) {
	ms := []Member{
		{Self: "https://a.example.net", Region: "ie"},
		{Self: "https://b.example.net", Region: "ie"},
		{Self: "https://c.example.net", Region: "fi"},
	}
	drainB := append([]Member{}, ms...)
	drainB[1].Draining = true
	without := []Member{ms[0], ms[2]}
	drainC := append([]Member{}, ms...)
	drainC[2].Draining = true
	movedFromB := 0
	for i := 0; i < 2000; i++ {
		host := fmt.Sprintf("s%d.example.com", i)
		o, ok := Owner(host, drainB, "")
		if !ok || o.Self == "https://b.example.net" {
			t.Fatalf("%s: owner %q (ok %v) with b draining", host, o.Self, ok)
		}
		if w, _ := Owner(host, without, ""); w.Self != o.Self {
			t.Fatalf("%s: with b draining owner %s, without b %s", host, o.Self, w.Self)
		}
		if before, _ := Owner(host, ms, ""); before.Self == "https://b.example.net" {
			movedFromB++
		} else if before.Self != o.Self {
			t.Fatalf("%s moved from %s to %s though only b drains", host, before.Self, o.Self)
		}
		if o, _ := Owner(host, drainB, "ie"); o.Self != "https://a.example.net" {
			t.Fatalf("%s: region ie with b draining placed on %s", host, o.Self)
		}
		// fi's only box drains: the space is served by the rest of the fleet.
		if o, ok := Owner(host, drainC, "fi"); !ok || o.Region != "ie" {
			t.Fatalf("%s: region fi with its only box draining placed on %q (ok %v)", host, o.Self, ok)
		}
	}
	if movedFromB == 0 {
		t.Fatal("b owned nothing before draining; the test proves nothing")
	}
	all := append([]Member{}, ms...)
	for i := range all {
		all[i].Draining = true
	}
	if o, ok := Owner("x.example.com", all, ""); ok {
		t.Fatalf("owner %s among draining members only", o.Self)
	}
}

// In a fleet whose boxes cover different domains, a host is owned only by a box that holds
// its row (its domains cover the host, or it is of the row's home region), and the share
// is spread over all of those; boxes whose heartbeats name no domains (older versions)
// place over the whole fleet, as before.
func TestOwnerAmongBoxesThatHoldTheRow(t *testing.T) {
	a := Member{Self: "https://a.mesh.test", Region: "ie", Domains: []string{"x.test", "y.test"}}
	b := Member{Self: "https://b.mesh.test", Region: "ie", Domains: []string{"x.test"}}
	c := Member{Self: "https://c.mesh.test", Region: "fi", Domains: []string{"y.test"}}
	fleet := []Member{a, b, c}
	for _, tc := range []struct {
		domain, home string
		want         []string // the boxes that may own
	}{
		{"x.test", "", []string{a.Self, b.Self}},
		{"y.test", "", []string{a.Self, c.Self}},
		{"x.test", "fi", []string{c.Self}},         // c holds rows homed in its region
		{"y.test", "ie", []string{a.Self, b.Self}}, // the home region narrows the holders (b: by region)
		{"z.test", "", []string{a.Self, b.Self, c.Self}},
	} {
		got := map[string]int{}
		for i := range 600 {
			ow, ok := Owner(fmt.Sprintf("h%d.%s", i, tc.domain), fleet, tc.home)
			if !ok {
				t.Fatalf("%s homed %q: no owner", tc.domain, tc.home)
			}
			got[ow.Self]++
		}
		if len(got) != len(tc.want) {
			t.Errorf("%s homed %q: owners %v, want each of %v", tc.domain, tc.home, got, tc.want)
		}
		for _, w := range tc.want {
			if got[w] == 0 {
				t.Errorf("%s homed %q: owners %v, want each of %v", tc.domain, tc.home, got, tc.want)
			}
		}
	}
	old := []Member{{Self: a.Self}, {Self: b.Self}, {Self: c.Self}}
	seen := map[string]bool{}
	for i := range 300 {
		ow, _ := Owner(fmt.Sprintf("h%d.x.test", i), old, "")
		seen[ow.Self] = true
	}
	if len(seen) != 3 {
		t.Errorf("members without domains: owners %v, want all three", seen)
	}
}
