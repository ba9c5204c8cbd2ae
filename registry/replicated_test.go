package registry

import (
	"errors"
	"testing"
	"time"
)

// TestReplicatedChanges: a peer's rows and tombstones, with and without revisions,
// applied in order to one registry.
func TestReplicatedChanges(t *testing.T) {
	g := openRev(t, "https://here.example.net", time.Now)
	const host = "a.example.com"
	rev := func(n uint64) string { return revOf(n, "https://peer.example.net") }
	row := func(r string) Route { return Route{Host: host, Kind: "lchat", Hibernate: true, Rev: r} }
	for _, tc := range []struct {
		name    string
		row     *Route // nil: a tombstone with rev
		rev     string
		want    error
		existed bool
		held    bool // a row for host afterwards
	}{
		{name: "unversioned tombstone of nothing", rev: "", held: false},
		{name: "versioned row", row: ptr(row(rev(10))), held: true},
		{name: "older row is stale", row: ptr(row(rev(5))), want: ErrStale, held: true},
		{name: "malformed tombstone revision", rev: "not-a-rev", want: ErrInvalidRev, held: true},
		{name: "older tombstone is stale", rev: rev(9), want: ErrStale, held: true},
		{name: "newer tombstone deletes", rev: rev(11), existed: true, held: false},
		{name: "row older than the tombstone is stale", row: ptr(row(rev(10))), want: ErrStale, held: false},
		{name: "unversioned row is stored as is", row: ptr(row("")), held: true},
		{name: "unversioned tombstone deletes", rev: "", existed: true, held: false},
	} {
		var err error
		var existed bool
		if tc.row != nil {
			_, err = g.ApplyReplicated(*tc.row)
		} else {
			existed, err = g.RemoveReplicated(host, tc.rev)
		}
		if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
			t.Fatalf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
		if existed != tc.existed {
			t.Fatalf("%s: existed = %v, want %v", tc.name, existed, tc.existed)
		}
		if _, ok := g.Lookup(host); ok != tc.held {
			t.Fatalf("%s: row held = %v, want %v", tc.name, ok, tc.held)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func revOf(clock uint64, origin string) string {
	const hex = "0123456789abcdef"
	b := make([]byte, 16)
	for i := 15; i >= 0; i-- {
		b[i] = hex[clock&15]
		clock >>= 4
	}
	return string(b) + "-" + origin
}
