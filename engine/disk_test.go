package engine

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/spacestore/pageread/pagereadtest"
)

// outsideTmpBase is where tests that give instances a private /tmp keep their state dirs
// and instance binaries: a private /tmp hides everything under the box's /tmp.
const outsideTmpBase = "/var/lib/lchat-engine-test"

// reachableInstanceOutsideTmp is reachableInstance in a directory outside /tmp.
func reachableInstanceOutsideTmp(t testing.TB, prefix string) (dir, inst string) {
	t.Helper()
	if err := os.MkdirAll(outsideTmpBase, 0o711); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(outsideTmpBase, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o711)
	bin, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	inst = filepath.Join(dir, "inst")
	if err := os.WriteFile(inst, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, inst
}

// diskEngine is an engine of isolated kinds (network host unless set) outside /tmp, on
// bucket b (nil: one of its own).
func diskEngine(t *testing.T, b bucket.Bucket, kinds map[string]Kind, uidFirst uint32) (*Engine, string) {
	t.Helper()
	if b == nil {
		var err error
		if b, err = filebucket.New(t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
	dir, inst := reachableInstanceOutsideTmp(t, "disk")
	for name, k := range kinds {
		k.Command, k.Env, k.Isolation = inst, map[string]string{"LCHAT_ENGINE_TEST_INSTANCE": "1"}, IsolationOn
		k.Replication, k.StopGrace = Replication{Class: ReplicateSleep}, 5*time.Second
		if k.Network == "" {
			k.Network = NetworkHost
		}
		kinds[name] = k
	}
	state := filepath.Join(dir, "state")
	e, err := New(Config{Bucket: b, StateDir: state, Holder: "box-" + filepath.Base(dir), Incarnation: "1",
		Kinds: kinds, UIDFirst: uidFirst, UIDCount: 100, PageReader: pagereadtest.Binary(t)})
	if err != nil {
		t.Fatal(err)
	}
	drainAtEnd(t, e)
	return e, state
}

func devOf(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Dev
}

// loopBackedBy lists the loop devices whose backing file is image.
func loopBackedBy(image string) []string {
	var out []string
	ms, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, m := range ms {
		if b, err := os.ReadFile(m); err == nil && strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == image {
			out = append(out, m)
		}
	}
	return out
}

// postNote has host's instance append a line to notes.txt in its data dir.
func postNote(t *testing.T, e *Engine, sp Space, note string) {
	t.Helper()
	u, err := e.Acquire(context.Background(), sp)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Release()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", u.Socket())
	}}}
	resp, err := c.Post("http://x/"+note, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("note: %d", resp.StatusCode)
	}
}

// TestDiskKindMountsOnceAndLeavesWithTheSpace: a space of a kind with limits.disk writes
// into its data dir on its own filesystem; the disk stays mounted, on the same loop
// device, across a sleep and a wake; a second box restores the space into a disk of its
// own; Remove unmounts the disk, clears its loop device and deletes the image; Close
// unmounts the rest.
func TestDiskKindMountsOnceAndLeavesWithTheSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	b, err := filebucket.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e, state := diskEngine(t, b, map[string]Kind{"app": {Limits: Limits{DiskBytes: 32 << 20}}}, 3200900)
	const host = "disk.example.com"
	sp := Space{Host: host, Kind: "app"}
	postNote(t, e, sp, "one")
	in := e.lookup(host)
	image := filepath.Join(state, "disks", host+".img")
	if devOf(t, in.dataDir) == devOf(t, in.dir) {
		t.Fatal("the data dir is not on the space's own filesystem")
	}
	loops := loopBackedBy(image)
	if len(loops) != 1 {
		t.Fatalf("loop devices of the image: %v", loops)
	}
	if err := e.Sleep(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	if l := loopBackedBy(image); len(l) != 1 || l[0] != loops[0] || devOf(t, in.dataDir) == devOf(t, in.dir) {
		t.Fatalf("after a sleep: loops %v (was %v); the disk must stay mounted", l, loops)
	}
	postNote(t, e, sp, "two")
	if l := loopBackedBy(image); len(l) != 1 || l[0] != loops[0] {
		t.Fatalf("after a wake: loops %v (was %v)", l, loops)
	}
	notes, err := os.ReadFile(filepath.Join(in.dataDir, "notes.txt"))
	if err != nil || string(notes) != "/one\n/two\n" {
		t.Fatalf("notes %q, %v", notes, err)
	}
	if err := e.Sleep(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	// The space moves: this box forgets it, another restores it into its own disk.
	if err := e.Remove(context.Background(), host); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Errorf("image after Remove: %v", err)
	}
	waitLoopsGone(t, image)
	e2, state2 := diskEngine(t, b, map[string]Kind{"app": {Limits: Limits{DiskBytes: 32 << 20}}}, 3200900)
	postNote(t, e2, sp, "three")
	in2 := e2.lookup(host)
	notes, err = os.ReadFile(filepath.Join(in2.dataDir, "notes.txt"))
	if err != nil || string(notes) != "/one\n/two\n/three\n" {
		t.Fatalf("restored notes %q, %v", notes, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e2.Drain(ctx)
	e2.Close()
	image2 := filepath.Join(state2, "disks", host+".img")
	if devOf(t, in2.dataDir) != devOf(t, in2.dir) {
		t.Error("still mounted after Close")
	}
	waitLoopsGone(t, image2)
	if _, err := os.Stat(image2); err != nil {
		t.Errorf("Close must keep the image: %v", err)
	}
}

func waitLoopsGone(t *testing.T, image string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(loopBackedBy(image)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("loop devices still backed by %s: %v", image, loopBackedBy(image))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
