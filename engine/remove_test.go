package engine

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/spacestore"
)

// post sends an acknowledged write to the test instance (it appends the path to notes.txt).
func post(t *testing.T, u *Use, path string) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", u.Socket())
	}}}
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://instance"+path, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %s", path, resp.Status)
	}
}

// savedNotes reads notes.txt from the space's current checkpoint in the bucket, by
// restoring it into a scratch directory (any manifest format).
func savedNotes(t *testing.T, b bucket.Bucket, host string) string {
	t.Helper()
	dir := t.TempDir()
	s := &spacestore.Syncer{Bucket: b, Host: host, DataDir: filepath.Join(dir, "data"), WorkDir: filepath.Join(dir, "work")}
	ctx := context.Background()
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(s.DataDir, "notes.txt"))
	return string(data)
}

// refuseManifests makes c refuse every manifest write while the returned flag is set (it
// starts set).
func refuseManifests(c *membucket.Counting) *atomic.Bool {
	refuse := new(atomic.Bool)
	refuse.Store(true)
	c.SetFail(func(ctx context.Context, op membucket.Op, key string) error {
		if refuse.Load() && op == membucket.OpPut && strings.HasSuffix(key, "/manifest") {
			return errors.New("injected: bucket refused the manifest")
		}
		return nil
	})
	return refuse
}

// checkpointKinds makes every kind of cfg acknowledge at checkpoints (the opt-out of
// the default, bucket), for tests of what only such a kind does.
func checkpointKinds(cfg *Config) {
	for name, k := range cfg.Kinds {
		k.Durability = DurabilityCheckpoint
		cfg.Kinds[name] = k
	}
}

func forgetTestEngine(t *testing.T, mod ...func(*Config)) (*Engine, *membucket.Counting) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "eng")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := Config{StateDir: dir, Kinds: map[string]Kind{"app": {
		Command:     self,
		Env:         map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"},
		Replication: Replication{Class: ReplicateSleep},
		StopGrace:   5 * time.Second,
	}}}
	for _, m := range mod {
		m(&cfg)
	}
	e, c := newCountingEngine(t, cfg)
	t.Cleanup(e.Close)
	return e, c
}

// TestRemoveSavesBeforeRemoving: removing (or tombstoning) an awake space saves the
// writes it acknowledged since its last checkpoint; a re-created route finds them. The
// old Remove (then Forget) stopped the instance and dropped its data dir without a checkpoint.
func TestRemoveSavesBeforeRemoving(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	e, c := forgetTestEngine(t)
	ctx := context.Background()
	sp := Space{Host: "removed.example.com", Kind: "app"}
	u, err := e.Acquire(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	post(t, u, "/acknowledged-1")
	post(t, u, "/acknowledged-2")
	u.Release()
	if err := e.Remove(ctx, sp.Host); err != nil {
		t.Fatal(err)
	}
	if got := savedNotes(t, c.Bucket, sp.Host); got != "/acknowledged-1\n/acknowledged-2\n" {
		t.Fatalf("bucket after removing an awake space holds %q, want both acknowledged writes", got)
	}
	if l, _, _ := spacestore.ReadLease(ctx, c.Bucket, sp.Host); !l.Released {
		t.Fatalf("lease after removal = %+v, want released", l)
	}
	if e.lookup(sp.Host) != nil {
		t.Fatal("removed space still known")
	}

	// When the checkpoint fails the local state is kept and the removal reports it.
	u, err = e.Acquire(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	post(t, u, "/acknowledged-3")
	u.Release()
	refuse := refuseManifests(c)
	if err := e.Remove(ctx, sp.Host); err == nil {
		t.Fatal("removal with a failing checkpoint reported success")
	}
	if e.lookup(sp.Host) == nil {
		t.Fatal("local state dropped although the checkpoint failed")
	}
	refuse.Store(false)
	if err := e.Remove(ctx, sp.Host); err != nil {
		t.Fatalf("removal once the bucket takes writes again: %v", err)
	}
	if got := savedNotes(t, c.Bucket, sp.Host); !strings.HasSuffix(got, "/acknowledged-3\n") {
		t.Fatalf("bucket after the retried removal holds %q, want the third write", got)
	}
}

// TestDiscardDropsUnsavedState: Discard is the named choice of not saving.
func TestDiscardDropsUnsavedState(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	e, c := forgetTestEngine(t)
	ctx := context.Background()
	sp := Space{Host: "discarded.example.com", Kind: "app"}
	u, err := e.Acquire(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	post(t, u, "/unsaved")
	pid := e.Status()[0].PID
	u.Release()
	if err := e.Discard(ctx, sp.Host); err != nil {
		t.Fatal(err)
	}
	if got := savedNotes(t, c.Bucket, sp.Host); got != "" {
		t.Fatalf("bucket after Discard holds %q, want nothing saved", got)
	}
	if !procGone(pid) {
		t.Fatal("instance running after Discard")
	}
	if l, _, _ := spacestore.ReadLease(ctx, c.Bucket, sp.Host); !l.Released {
		t.Fatalf("lease after Discard = %+v, want released", l)
	}
}

// TestAcquireAfterRemoveTakesTheNewInst: a request that found a space's inst before a
// removal dropped it (a tombstone arriving while requests run, then the route created
// again) wakes the host's current inst, never the forgotten one: before, it woke the
// orphan while the next requests woke a new inst, two instances of one space on one box
// whose checkpoints overwrote each other's writes and whose cleanup removed the other's
// socket (found by the 30-minute fault campaign).
func TestAcquireAfterRemoveTakesTheNewInst(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	e, c := forgetTestEngine(t)
	ctx := context.Background()
	sp := Space{Host: "recreated.example.com", Kind: "app"}
	u, err := e.Acquire(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	post(t, u, "/before-removal")
	u.Release()
	stale := e.lookup(sp.Host) // what a request in flight holds
	if err := e.Remove(ctx, sp.Host); err != nil {
		t.Fatal(err)
	}
	kind, _ := e.kind(sp.Kind)
	u, err = e.acquire(ctx, sp, kind, stale)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Release()
	if u.in == stale {
		t.Fatal("the forgotten inst woke again")
	}
	if cur := e.lookup(sp.Host); cur != u.in {
		t.Fatalf("the Use's inst is not the host's inst (%p, map has %p): two instances can run", u.in, cur)
	}
	stale.mu.Lock()
	state, proc := stale.state, stale.proc
	stale.mu.Unlock()
	if state != StateDropped || proc != nil {
		t.Fatalf("forgotten inst is %s with a process %v, want dropped without one", state, proc != nil)
	}
	// The new instance serves the saved state and its own socket.
	post(t, u, "/after-recreate")
	u.Release()
	if err := e.Sleep(ctx, sp.Host); err != nil {
		t.Fatal(err)
	}
	if got := savedNotes(t, c.Bucket, sp.Host); got != "/before-removal\n/after-recreate\n" {
		t.Fatalf("bucket holds %q", got)
	}
}

// TestStaleHeartbeatRefusesUse: a box whose heartbeat is past its fence time (Config.Fresh
// false: it was paused, and its fence timer has not run yet) serves no request, even from
// an awake instance: another box may hold the space by now. Fresh again, it serves.
func TestStaleHeartbeatRefusesUse(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real instances")
	}
	var fresh atomic.Bool
	fresh.Store(true)
	e, _ := forgetTestEngine(t, func(c *Config) { c.Fresh = fresh.Load })
	ctx := context.Background()
	sp := Space{Host: "paused.example.com", Kind: "app"}
	u, err := e.Acquire(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	u.Release()
	fresh.Store(false)
	var retry *RetryError
	if _, err := e.Acquire(ctx, sp); !errors.As(err, &retry) {
		t.Fatalf("Acquire with a stale heartbeat: %v, want a RetryError", err)
	}
	fresh.Store(true)
	u, err = e.Acquire(ctx, sp)
	if err != nil {
		t.Fatalf("Acquire once fresh again: %v", err)
	}
	u.Release()
}
