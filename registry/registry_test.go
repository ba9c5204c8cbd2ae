package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func TestValidateHost(t *testing.T) {
	good := []string{"8oe.example.com", "demo.localhost", "xn--bcher-kva.example", "a", "a-b.c0"}
	for _, h := range good {
		if err := ValidateHost(h); err != nil {
			t.Errorf("ValidateHost(%q) = %v, want ok", h, err)
		}
	}
	bad := map[string]string{
		"":                               "empty",
		"Demo.example.com":               "lowercase",
		"demo.example.com:443":           "port",
		"demo.example.com/x":             "path",
		"*.example.com":                  "wildcard",
		"demo.example.com.":              "dot",
		"127.0.0.1":                      "IP address",
		"a..b":                           "empty label",
		"-a.b":                           "hyphen",
		"a_b.c":                          "only a-z",
		"bücher.example":                 "punycode",
		strings.Repeat("a", 64) + ".com": "63",
	}
	for h, want := range bad {
		err := ValidateHost(h)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateHost(%q) = %v, want error mentioning %q", h, err, want)
		}
	}
}

func TestRouteValidate(t *testing.T) {
	for _, tc := range []struct {
		rt   Route
		want string
	}{
		{Route{Host: "a.b", Hibernate: true, Kind: "demo"}, ""},
		{Route{Host: "a.b", Upstream: "127.0.0.1:9000"}, ""},
		{Route{Host: "a.b", Hibernate: true}, "needs a kind"},
		{Route{Host: "a.b"}, "needs an upstream"},
		{Route{Host: "a.b", Hibernate: true, Kind: "demo", Upstream: "x:1"}, "cannot have an upstream"},
		{Route{Host: "a.b", Hibernate: true, Kind: "demo", Env: map[string]string{"1X": "v"}}, "invalid env name"},
		{Route{Host: "A.b", Hibernate: true, Kind: "demo"}, "lowercase"},
		// A live space pinned to another box of the mesh: no upstream here.
		{Route{Host: "a.b", Kind: "demo", LivesAt: "https://box-1.example.net"}, ""},
		{Route{Host: "a.b", LivesAt: "http://127.0.0.2:8443"}, ""},
		{Route{Host: "a.b", LivesAt: "https://box-1.example.net", Upstream: "127.0.0.1:9000"}, "both an upstream and lives_at"},
		{Route{Host: "a.b", Hibernate: true, Kind: "demo", LivesAt: "https://box-1.example.net"}, "cannot have lives_at"},
		{Route{Host: "a.b", LivesAt: "box-1.example.net"}, "scheme"},
		{Route{Host: "a.b", LivesAt: "ftp://box-1.example.net"}, "scheme"},
		{Route{Host: "a.b", LivesAt: "https://box-1.example.net/path"}, "no path"},
		{Route{Host: "a.b", LivesAt: "https://user@box-1.example.net"}, "no path"},
		{Route{Host: "a.b", LivesAt: "https://"}, "no host"},
	} {
		err := tc.rt.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.rt, err, tc.want)
		}
	}
}

func openTest(t *testing.T, path string, now func() time.Time) *Registry {
	t.Helper()
	g, err := Open(path, Options{Now: now, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

func TestPutGetDeletePersist(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reg.db")
	clock := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { return clock }
	g := openTest(t, path, now)

	rt, err := g.Put(Route{Host: "a.example.com", Kind: "demo", Hibernate: true, Env: map[string]string{"TOKEN": "s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	if !rt.Created.Equal(clock) || !rt.Updated.Equal(clock) {
		t.Fatalf("times = %v %v, want %v", rt.Created, rt.Updated, clock)
	}
	clock = clock.Add(time.Hour)
	rt, err = g.Update("a.example.com", func(r *Route) error { r.Version = "2"; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if !rt.Created.Equal(clock.Add(-time.Hour)) || !rt.Updated.Equal(clock) || rt.Version != "2" {
		t.Fatalf("after update: %+v", rt)
	}
	// A caller's copy must not alias the stored env.
	rt.Env["TOKEN"] = "changed"
	if got, _ := g.Lookup("a.example.com"); got.Env["TOKEN"] != "s3cret" {
		t.Fatalf("stored env changed through a returned copy: %q", got.Env["TOKEN"])
	}
	if _, err := g.Put(Route{Host: "bad host"}); err == nil {
		t.Fatal("Put accepted an invalid host")
	}
	if g.Len() != 1 {
		t.Fatalf("Len = %d after a rejected put", g.Len())
	}

	// A second open of the same file (the server holds it) fails clearly.
	if _, err := Open(path, Options{Timeout: 100 * time.Millisecond}); err == nil || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("second Open = %v, want locked error", err)
	}

	g.Close()
	g2 := openTest(t, path, now)
	got, err := g2.Get("a.example.com")
	if err != nil || got.Version != "2" || got.Env["TOKEN"] != "s3cret" {
		t.Fatalf("after reopen: %+v, %v", got, err)
	}
	if err := g2.Delete("a.example.com"); err != nil {
		t.Fatal(err)
	}
	if err := g2.Delete("a.example.com"); err != ErrNotFound {
		t.Fatalf("second delete = %v, want ErrNotFound", err)
	}
	if _, ok := g2.Lookup("a.example.com"); ok {
		t.Fatal("deleted route still found")
	}
}

func TestListPaging(t *testing.T) {
	g := openTest(t, filepath.Join(t.TempDir(), "reg.db"), nil)
	var rts []Route
	for i := 0; i < 25; i++ {
		rts = append(rts, Route{Host: fmt.Sprintf("h%02d.example.com", 24-i), Kind: "demo", Hibernate: true})
	}
	if err := g.PutMany(rts); err != nil {
		t.Fatal(err)
	}
	var seen []string
	after := ""
	pages := 0
	for {
		page, next, err := g.List(after, 10)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, rt := range page {
			seen = append(seen, rt.Host)
		}
		if next == "" {
			break
		}
		after = next
	}
	if pages != 3 || len(seen) != 25 {
		t.Fatalf("pages=%d routes=%d, want 3 and 25", pages, len(seen))
	}
	for i, h := range seen {
		if want := fmt.Sprintf("h%02d.example.com", i); h != want {
			t.Fatalf("seen[%d] = %s, want %s (sorted)", i, h, want)
		}
	}
	// An exact page boundary must not produce an empty extra page.
	if _, next, _ := g.List("h14.example.com", 10); next != "" {
		t.Fatalf("last full page returned cursor %q", next)
	}
}

func TestSummaryHasNoEnvValues(t *testing.T) {
	rt := Route{Host: "a.b", Kind: "k", Hibernate: true, Env: map[string]string{"B": "secret-b", "A": "secret-a"}}
	b, _ := json.Marshal(rt.Summary())
	if strings.Contains(string(b), "secret") {
		t.Fatalf("summary leaks env values: %s", b)
	}
	if s := rt.Summary(); len(s.EnvNames) != 2 || s.EnvNames[0] != "A" {
		t.Fatalf("EnvNames = %v", s.EnvNames)
	}
}

func TestConcurrentLookupAndPut(t *testing.T) {
	g := openTest(t, filepath.Join(t.TempDir(), "reg.db"), nil)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				g.Lookup(fmt.Sprintf("h%d.x", i))
			}
		}()
	}
	for i := 0; i < 50; i++ {
		if _, err := g.Put(Route{Host: fmt.Sprintf("h%d.x", i), Kind: "k", Hibernate: true}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if g.Len() != 50 {
		t.Fatalf("Len = %d", g.Len())
	}
}

func fill(b testing.TB, path string, n int) {
	g, err := Open(path, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	const batch = 10000
	for i := 0; i < n; i += batch {
		var rts []Route
		for j := i; j < i+batch && j < n; j++ {
			rts = append(rts, Route{Host: fmt.Sprintf("s%06d.example.com", j), Kind: "demo", Hibernate: true,
				Version: "1", Env: map[string]string{"LCHAT_ADMIN_TOKEN": "0123456789abcdef0123456789abcdef"}})
		}
		if err := g.PutMany(rts); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLookup100k measures the request-path lookup with 100,000 routes loaded.
func BenchmarkLookup100k(b *testing.B) {
	path := filepath.Join(b.TempDir(), "reg.db")
	fill(b, path, 100000)
	g, err := Open(path, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	hosts := make([]string, 1024)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("s%06d.example.com", i*97)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := g.Lookup(hosts[i&1023]); !ok {
				b.Fatal("miss")
			}
			i++
		}
	})
}

// BenchmarkOpen100k measures the start-up load of 100,000 routes.
func BenchmarkOpen100k(b *testing.B) {
	path := filepath.Join(b.TempDir(), "reg.db")
	fill(b, path, 100000)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		g, err := Open(path, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if g.Len() != 100000 {
			b.Fatalf("loaded %d", g.Len())
		}
		g.Close()
	}
}

// TestLivesAtRow: a "lives elsewhere" row is stored and reloaded as it is, and a row
// stored by an older version with the peer's address as its upstream loads without
// that upstream (so it is never dialed locally) and can be updated.
func TestLivesAtRow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "reg.db")
	g, err := Open(path, Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Put(Route{Host: "live.example.com", Kind: "demo", LivesAt: "https://box-2.example.net"}); err != nil {
		t.Fatal(err)
	}
	old, _ := json.Marshal(Route{Host: "old.example.com", Kind: "demo", LivesAt: "https://box-2.example.net", Upstream: "box-2.example.net:443"})
	if err := g.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(routesBucket).Put([]byte("old.example.com"), old) }); err != nil {
		t.Fatal(err)
	}
	g.Close()
	g = openTest(t, path, time.Now)
	for _, h := range []string{"live.example.com", "old.example.com"} {
		rt, ok := g.Lookup(h)
		if !ok || rt.Hibernate || rt.LivesAt != "https://box-2.example.net" || rt.Upstream != "" {
			t.Fatalf("%s after reopen: %+v, %v; want lives_at and no upstream", h, rt, ok)
		}
		if err := rt.Validate(); err != nil {
			t.Fatalf("%s after reopen: %v", h, err)
		}
	}
	if _, err := g.Update("old.example.com", func(r *Route) error { r.Version = "2"; return nil }); err != nil {
		t.Fatalf("updating a migrated row: %v", err)
	}
}

// TestCreateConcurrent: of many concurrent creates of one host exactly one succeeds and
// the others get ErrExists; the stored route is the winner's.
func TestCreateConcurrent(t *testing.T) {
	g := openTest(t, filepath.Join(t.TempDir(), "reg.db"), nil)
	const n = 32
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = g.Create(Route{Host: "dup.example.com", Kind: "demo", Hibernate: true, Version: fmt.Sprint(i)})
		}()
	}
	close(start)
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if won >= 0 {
				t.Fatalf("creates %d and %d both succeeded", won, i)
			}
			won = i
		case !errors.Is(err, ErrExists):
			t.Fatalf("create %d: %v, want ErrExists", i, err)
		}
	}
	if won < 0 {
		t.Fatal("no create succeeded")
	}
	if rt, _ := g.Lookup("dup.example.com"); rt.Version != fmt.Sprint(won) {
		t.Fatalf("stored version %q, want the winner's %d", rt.Version, won)
	}
	if _, err := g.Create(Route{Host: "bad host"}); err == nil || errors.Is(err, ErrExists) {
		t.Fatalf("Create of an invalid route: %v, want a validation error", err)
	}
}

func TestValidateRegion(t *testing.T) {
	for r, ok := range map[string]bool{
		"eu": true, "us-east-1": true, "r2": true, strings.Repeat("a", 32): true,
		"": false, strings.Repeat("a", 33): false, "EU": false, "eu_west": false, "eu.west": false,
		"eu west": false, "eu/1": false, "é": false,
	} {
		if err := ValidateRegion(r); (err == nil) != ok {
			t.Errorf("ValidateRegion(%q) = %v, want ok=%v", r, err, ok)
		}
	}
}

func TestValidKind(t *testing.T) {
	for s, want := range map[string]bool{
		"demo": true, "demo-2": true, "a_b": true, "9": true, strings.Repeat("k", 64): true,
		"": false, "Demo": false, "-demo": false, "_demo": false, "de.mo": false, "de mo": false, strings.Repeat("k", 65): false,
	} {
		if got := ValidKind(s); got != want {
			t.Errorf("ValidKind(%q) = %v, want %v", s, got, want)
		}
	}
}
