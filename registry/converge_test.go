package registry

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"
)

// change is one replicated message: a row (PUT) or a tombstone (DELETE).
type change struct {
	row  *Route
	host string
	rev  string
}

func (c change) apply(t *testing.T, g *Registry) {
	t.Helper()
	var err error
	if c.row != nil {
		_, err = g.ApplyRow(*c.row)
	} else {
		_, err = g.ApplyTombstone(c.host, c.rev)
	}
	if err != nil && !errors.Is(err, ErrStale) {
		t.Fatalf("applying %+v: %v", c, err)
	}
}

func openRev(t *testing.T, origin string, now func() time.Time) *Registry {
	t.Helper()
	g, err := Open(filepath.Join(t.TempDir(), "reg.db"), Options{Origin: origin, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// TestReplicationConverges: 300 mixed create / delete / re-create / hibernate-flip /
// relocate changes made on one box reach three peers through a channel that delays,
// duplicates and reorders every message (each peer gets its own shuffle, each message
// up to three times). Every peer's registry ends equal to the issuer's: no zombie (a
// deleted host alive on a peer), no lost re-create, no older row over a newer one.
func TestReplicationConverges(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	// The issuer's clock runs slow and even goes backwards: revisions must not care.
	var clock = time.Unix(1_800_000_000, 0)
	issuer := openRev(t, "https://issuer.example.net", func() time.Time {
		clock = clock.Add(time.Duration(rng.IntN(5)-2) * time.Millisecond)
		return clock
	})
	peers := []*Registry{
		openRev(t, "https://p1.example.net", time.Now),
		openRev(t, "https://p2.example.net", time.Now),
		openRev(t, "https://p3.example.net", func() time.Time { return time.Now().Add(-5 * time.Minute) }),
	}
	hosts := make([]string, 12)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("s%d.example.com", i)
	}
	var log []change
	kinds := map[string]int{}
	for range 300 {
		h := hosts[rng.IntN(len(hosts))]
		cur, exists := issuer.Lookup(h)
		switch op := rng.IntN(4); {
		case !exists: // create, or re-create after a delete
			rt, err := issuer.Put(Route{Host: h, Kind: "demo", Hibernate: true})
			if err != nil {
				t.Fatal(err)
			}
			kinds["create"]++
			log = append(log, change{row: &rt})
		case op == 0:
			if err := issuer.Delete(h); err != nil {
				t.Fatal(err)
			}
			rev, _ := issuer.TombstoneRev(h)
			kinds["delete"]++
			log = append(log, change{host: h, rev: rev})
		case op == 1: // hibernate flip
			rt, err := issuer.Update(h, func(rt *Route) error {
				if rt.Hibernate {
					rt.Hibernate, rt.LivesAt = false, "https://issuer.example.net"
				} else {
					rt.Hibernate, rt.LivesAt = true, ""
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			kinds["hibernate-flip"]++
			log = append(log, change{row: &rt})
		default: // relocate: a new home region
			region := []string{"eu", "us", "ap"}[rng.IntN(3)]
			if cur.HomeRegion == region {
				region = ""
			}
			rt, err := issuer.Update(h, func(rt *Route) error { rt.HomeRegion = region; return nil })
			if err != nil {
				t.Fatal(err)
			}
			kinds["relocate"]++
			log = append(log, change{row: &rt})
		}
	}
	t.Logf("changes by kind: %v", kinds)

	// The same deliveries applied the old way (every PUT stored, every DELETE applied)
	// leave zombies and stale rows: the check below can fail.
	legacy := openRev(t, "https://legacy.example.net", time.Now)
	var all []change
	for _, c := range log {
		all = append(all, c, c)
	}
	rng.Shuffle(len(all), func(a, b int) { all[a], all[b] = all[b], all[a] })
	for _, c := range all {
		if c.row != nil {
			legacy.Put(*c.row)
		} else {
			legacy.Delete(c.host)
		}
	}
	wrong := 0
	for _, h := range hosts {
		want, wantOK := issuer.Lookup(h)
		got, gotOK := legacy.Lookup(h)
		if gotOK != wantOK || gotOK && (got.Hibernate != want.Hibernate || got.HomeRegion != want.HomeRegion) {
			wrong++
		}
	}
	t.Logf("unversioned delivery of the same changes: %d of %d hosts wrong", wrong, len(hosts))
	if wrong == 0 {
		t.Fatal("unversioned delivery converged too: the reordering shows nothing")
	}

	for i, p := range peers {
		// Each message delivered 1-3 times (retries, duplicates), in a random order.
		var deliveries []change
		for _, c := range log {
			for range 1 + rng.IntN(3) {
				deliveries = append(deliveries, c)
			}
		}
		rng.Shuffle(len(deliveries), func(a, b int) { deliveries[a], deliveries[b] = deliveries[b], deliveries[a] })
		for _, c := range deliveries {
			c.apply(t, p)
		}
		zombies, diffs := 0, 0
		for _, h := range hosts {
			want, wantOK := issuer.Lookup(h)
			got, gotOK := p.Lookup(h)
			switch {
			case gotOK && !wantOK:
				zombies++
				t.Errorf("peer %d: zombie %s = %+v", i+1, h, got)
			case !gotOK && wantOK:
				diffs++
				t.Errorf("peer %d: %s missing, issuer has %+v", i+1, h, want)
			case gotOK && (got.Rev != want.Rev || got.Hibernate != want.Hibernate || got.HomeRegion != want.HomeRegion || got.LivesAt != want.LivesAt):
				diffs++
				t.Errorf("peer %d: %s = %+v, issuer %+v", i+1, h, got, want)
			}
		}
		if zombies > 0 || diffs > 0 {
			t.Fatalf("peer %d after %d deliveries: %d zombies, %d rows differing from the issuer", i+1, len(deliveries), zombies, diffs)
		}
	}
}

// TestTombstoneRules: a late row older than a delete does not resurrect the host; a
// tombstone older than a re-create does not remove it; a tombstone naming exactly the
// revision a listing showed deletes that row (prune); tombstones expire after the TTL.
func TestTombstoneRules(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	src := openRev(t, "https://a", func() time.Time { now = now.Add(time.Millisecond); return now })
	dst, err := Open(filepath.Join(t.TempDir(), "reg.db"), Options{Origin: "https://b", Now: func() time.Time { return now }, TombstoneTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	created, _ := src.Put(Route{Host: "z.example.com", Kind: "demo", Hibernate: true})
	src.Delete("z.example.com")
	delRev, _ := src.TombstoneRev("z.example.com")
	if _, err := dst.ApplyTombstone("z.example.com", delRev); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.ApplyRow(created); !errors.Is(err, ErrStale) {
		t.Fatalf("late row after its delete: %v, want ErrStale", err)
	}
	if _, ok := dst.Lookup("z.example.com"); ok {
		t.Fatal("a late row resurrected a deleted host")
	}
	again, _ := src.Put(Route{Host: "z.example.com", Kind: "demo", Hibernate: true})
	if _, err := dst.ApplyRow(again); err != nil {
		t.Fatalf("re-create after the delete: %v", err)
	}
	if _, err := dst.ApplyTombstone("z.example.com", delRev); !errors.Is(err, ErrStale) {
		t.Fatalf("old tombstone after a re-create: %v, want ErrStale", err)
	}
	if deleted, err := dst.ApplyTombstone("z.example.com", again.Rev); err != nil || !deleted {
		t.Fatalf("tombstone of exactly the listed revision: %v %v, want deleted", deleted, err)
	}
	now = now.Add(2 * time.Hour)
	dst.Put(Route{Host: "other.example.com", Kind: "demo", Hibernate: true})
	dst.Delete("other.example.com") // a write that expires old tombstones
	if _, ok := dst.TombstoneRev("z.example.com"); ok {
		t.Fatal("tombstone remembered past its TTL")
	}
	// A restart keeps the tombstones and never issues a revision below one it stored.
	path := dst.Path()
	rev, _ := dst.TombstoneRev("other.example.com")
	dst.Close()
	back, err := Open(path, Options{Origin: "https://b", Now: func() time.Time { return time.Unix(0, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	if got, ok := back.TombstoneRev("other.example.com"); !ok || got != rev {
		t.Fatalf("tombstone after reopening = %q %v, want %q", got, ok, rev)
	}
	rt, _ := back.Put(Route{Host: "other.example.com", Kind: "demo", Hibernate: true})
	if rt.Rev <= rev {
		t.Fatalf("revision %s after a restart with the clock at 1970 is not above %s", rt.Rev, rev)
	}
}

// TestUnversionedChanges: a row or delete from a box without revisions applies as before
// but claims no order: any versioned change for the host overrides it, and it does not
// make a tombstone forget its revision.
func TestUnversionedChanges(t *testing.T) {
	src := openRev(t, "https://a", time.Now)
	dst := openRev(t, "https://b", time.Now)
	rt, _ := src.Put(Route{Host: "u.example.com", Kind: "demo", Hibernate: true})
	if _, err := dst.ApplyRow(rt); err != nil {
		t.Fatal(err)
	}
	if err := dst.DeleteUnversioned("u.example.com"); err != nil {
		t.Fatal(err)
	}
	if _, ok := dst.TombstoneRev("u.example.com"); ok {
		t.Fatal("an unversioned delete left a tombstone that outranks versioned rows")
	}
	if _, err := dst.ApplyRow(rt); err != nil {
		t.Fatalf("versioned row after an unversioned delete: %v", err)
	}
	legacy, err := dst.PutUnversioned(Route{Host: "u.example.com", Kind: "demo", Hibernate: false, Upstream: "127.0.0.1:9"})
	if err != nil || legacy.Rev != "" {
		t.Fatalf("unversioned put = %+v, %v; want stored without a revision", legacy, err)
	}
	src.Delete("u.example.com")
	rev, _ := src.TombstoneRev("u.example.com")
	if deleted, err := dst.ApplyTombstone("u.example.com", rev); err != nil || !deleted {
		t.Fatalf("versioned tombstone over an unversioned row: %v %v", deleted, err)
	}
}
