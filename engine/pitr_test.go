package engine

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/spacestore"
)

// TestRestoreToRefusedWhileAwake: a point-in-time restore of a space awake on this box is
// refused and writes nothing; asleep, it restores the chosen checkpoint for the next wake,
// and restoring the generation before it undoes it.
func TestRestoreToRefusedWhileAwake(t *testing.T) {
	e := newAwakeTestEngine(t, 0)
	ctx := context.Background()
	const host = "pitr.example.com"
	sp := Space{Host: host, Kind: "app"}
	visit := func(path string) {
		t.Helper()
		u, err := e.Acquire(ctx, sp)
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", u.Socket())
		}}}
		resp, err := c.Post("http://x"+path, "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		u.Release()
	}
	notes := func() string {
		t.Helper()
		u, err := e.Acquire(ctx, sp)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Release()
		data, _ := os.ReadFile(filepath.Join(e.cfg.StateDir, "spaces", host, "data", "notes.txt"))
		return strings.TrimSpace(string(data))
	}
	visit("/one")
	if err := e.Sleep(ctx, host); err != nil {
		t.Fatal(err)
	}
	visit("/two")
	u, err := e.Acquire(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	_, before, _ := spacestore.ReadManifest(ctx, e.cfg.Bucket, host)
	if _, err := e.RestoreTo(ctx, host, "app", spacestore.Target{Generation: 1}); !errors.Is(err, ErrAwake) {
		t.Fatalf("restore of an awake space = %v, want ErrAwake", err)
	}
	if _, after, _ := spacestore.ReadManifest(ctx, e.cfg.Bucket, host); after != before {
		t.Fatal("a refused restore wrote the manifest")
	}
	u.Release()
	if err := e.Sleep(ctx, host); err != nil {
		t.Fatal(err)
	}
	hist, err := e.History(ctx, host)
	if err != nil || len(hist) != 2 {
		t.Fatalf("history = %+v, %v; want 2 checkpoints", hist, err)
	}
	res, err := e.RestoreTo(ctx, host, "app", spacestore.Target{Generation: 1})
	if err != nil || res.Generation != 3 {
		t.Fatalf("restore = %+v, %v", res, err)
	}
	if got := notes(); got != "/one" {
		t.Fatalf("after restoring generation 1 the space holds %q, want /one", got)
	}
	if err := e.Sleep(ctx, host); err != nil {
		t.Fatal(err)
	}
	if _, err := e.RestoreTo(ctx, host, "app", spacestore.Target{Generation: 2}); err != nil {
		t.Fatal(err)
	}
	if got := notes(); got != "/one\n/two" {
		t.Fatalf("after undoing the restore the space holds %q", got)
	}
}
