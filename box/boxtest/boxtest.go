// Package boxtest opens boxes for tests: one fixture for the box package's tests and for
// the glue's (modules/lchat), which serve the same box through its doors.
package boxtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/mesh"
)

// Options say what box Open opens.
type Options struct {
	// Bucket is the box's bucket. Default: a new membucket.
	Bucket bucket.Bucket
	// Mesh is the mesh identity; the zero value: no mesh. Its heartbeat goes to Bucket.
	Mesh mesh.Config
	// Settings are started with the box. Default Kinds: Kinds("/bin/true").
	Settings box.Settings
	// Exiting is box.Config.Exiting. Default: never.
	Exiting func() bool
	// WakeScan is the engine's WakeScanInterval. Default: the engine's.
	WakeScan time.Duration
}

// Open opens and starts a box in a temporary directory, closed (drained) when the test
// ends.
func Open(t testing.TB, o Options) *box.Box {
	t.Helper()
	if o.Bucket == nil {
		o.Bucket = membucket.New()
	}
	if o.Settings.Kinds == nil {
		o.Settings.Kinds = Kinds("/bin/true")
	}
	// Not t.TempDir: instance sockets live under the state dir, and a Unix socket path
	// is short.
	dir, err := os.MkdirTemp("", "box")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b, err := box.Open(box.Config{
		Bucket:       o.Bucket,
		StateDir:     filepath.Join(dir, "state"),
		Registry:     filepath.Join(dir, "registry.db"),
		Holder:       "box:test",
		DrainTimeout: 30 * time.Second,
		Engine:       engine.Config{Kinds: o.Settings.Kinds, WakeScanInterval: o.WakeScan},
		Mesh:         o.Mesh,
		Exiting:      o.Exiting,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	s := o.Settings
	if err := b.Start(&s); err != nil {
		t.Fatal(err)
	}
	return b
}

// Kinds are the kinds of a test box: "demo", running command (InstanceKinds: this test
// binary as an instance) and passing the route env DEMO_SECRET.
func Kinds(command string) map[string]engine.Kind {
	return map[string]engine.Kind{"demo": {
		Name: "demo", Command: command, AllowedEnv: []string{"DEMO_SECRET"}, Isolation: "none",
		Env: map[string]string{InstanceEnv: "1"}, Replication: engine.Replication{Class: engine.ReplicateSleep},
		StopGrace: 5 * time.Second,
	}}
}

// InstanceKinds are Kinds running this test binary, which must call RunInstance first in
// its TestMain.
func InstanceKinds(t testing.TB) map[string]engine.Kind {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Kinds(self)
}

// Wake wakes host's space on b (its route must exist and hibernate) and writes a note
// into its data directory through its instance (InstanceKinds), so its next checkpoint
// has something to save. The space stays awake until it sleeps.
func Wake(t testing.TB, b *box.Box, host string) {
	t.Helper()
	rt, ok := b.Lookup(host)
	if !ok {
		t.Fatalf("no route for %s", host)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	use, err := b.Acquire(ctx, rt)
	if err != nil {
		t.Fatalf("waking %s: %v", host, err)
	}
	defer use.Release()
	c := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", use.Socket())
	}}}
	resp, err := c.Post("http://"+host+"/note", "text/plain", nil)
	if err != nil {
		t.Fatalf("writing a note in %s: %v", host, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("writing a note in %s: %s", host, resp.Status)
	}
}

// Awake reports whether host's space is awake on b.
func Awake(b *box.Box, host string) bool {
	for _, s := range b.Spaces() {
		if s.Host == host {
			return s.State == engine.StateAwake
		}
	}
	return false
}

// InstanceEnv, set to 1 in an instance's environment, makes RunInstance serve.
const InstanceEnv = "LCHAT_BOXTEST_INSTANCE"

// RunInstance makes this process a minimal instance when InstanceEnv is 1, and does not
// return then: it serves on $LCHAT_SOCKET, a POST appending its path to notes.txt in
// $LCHAT_DATA_DIR (a write for the checkpoint to save), until SIGTERM. Call it first in
// the TestMain of a package whose tests run InstanceKinds.
func RunInstance() {
	if os.Getenv(InstanceEnv) != "1" {
		return
	}
	ln, err := net.Listen("unix", os.Getenv("LCHAT_SOCKET"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	notes := filepath.Join(os.Getenv("LCHAT_DATA_DIR"), "notes.txt")
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			f, err := os.OpenFile(notes, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			fmt.Fprintln(f, r.URL.Path)
			f.Close()
		}
	}))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	ln.Close()
	os.Exit(0)
}
