package ledger

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
)

func TestMintHost(t *testing.T) {
	for _, tc := range []struct {
		id     uint64
		domain string
		want   string
	}{
		{1, "example.com", "1.example.com"},
		{35, "*.example.com", "z.example.com"},
		{10000, " Example.COM ", "7ps.example.com"},
		{120001, "fi.example.net", "2kld.fi.example.net"},
	} {
		got, err := MintHost(tc.id, tc.domain)
		if err != nil || got != tc.want {
			t.Errorf("MintHost(%d, %q) = %q, %v; want %q", tc.id, tc.domain, got, err, tc.want)
		}
	}
	if _, err := MintHost(0, "example.com"); err == nil {
		t.Error("id 0 minted")
	}
	if _, err := MintHost(1, ""); err == nil {
		t.Error("minted without a domain")
	}
}

// TestMintSkipsTakenHosts: a host that already has a route is skipped, not overwritten.
func TestMintSkipsTakenHosts(t *testing.T) {
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, _ := New(b, "ns", Options{})
	taken := map[string]bool{"1.example.com": true, "2.example.com": true}
	host, id, err := Mint(context.Background(), a, "example.com", func(h string) error {
		if taken[h] {
			return ErrTaken
		}
		return nil
	})
	if err != nil || host != "3.example.com" || id != 3 {
		t.Fatalf("Mint = %q %d %v, want 3.example.com", host, id, err)
	}
	boom := errors.New("registry down")
	if _, _, err := Mint(context.Background(), a, "example.com", func(string) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("claim error %v, want it returned", err)
	}
	if _, _, err := Mint(context.Background(), a, "example.com", func(string) error { return ErrTaken }); err == nil || !strings.Contains(err.Error(), "seed") {
		t.Fatalf("endless taken hosts: %v", err)
	}
}

// TestMintConcurrentAllocatorsNeverCollide: allocators of two boxes on one bucket mint at
// once; every host is distinct.
func TestMintConcurrentAllocatorsNeverCollide(t *testing.T) {
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for box := 0; box < 2; box++ {
		a, _ := New(b, "cloud", Options{Block: 7})
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 25; i++ {
					_, _, err := Mint(context.Background(), a, "example.com", func(h string) error {
						mu.Lock()
						defer mu.Unlock()
						if seen[h] {
							t.Errorf("host %s minted twice", h)
						}
						seen[h] = true
						return nil
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if len(seen) != 200 {
		t.Fatalf("%d distinct hosts, want 200", len(seen))
	}
}
