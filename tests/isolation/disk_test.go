package isolation

import (
	"encoding/json"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// diskLimit is the disk kind's limits.disk in isoCaddyfile.
const diskLimit = 32 << 20

// freeBytes is what the filesystem holding path has free for an unprivileged writer.
func freeBytes(t *testing.T, path string) int64 {
	t.Helper()
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		t.Fatal(err)
	}
	return int64(fs.Bavail) * fs.Bsize
}

// allocated sums the disk blocks of the files under dir on dir's own filesystem (not
// inside the spaces' disks, which are mounted below it).
func allocated(t *testing.T, dir string) int64 {
	t.Helper()
	var root unix.Stat_t
	if err := unix.Stat(dir, &root); err != nil {
		t.Fatal(err)
	}
	var sum int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if st.Dev != root.Dev {
			return filepath.SkipDir
		}
		sum += st.Blocks * 512
		return nil
	})
	return sum
}

// fillAttempt is how much the attacker tries to write: far past the limit, so that
// without it the box's filesystem would visibly lose all of this, whatever other tests
// write to it meanwhile.
const fillAttempt = 1 << 30

// fill has host's instance write to path until its disk stops it, and checks that the
// write failed with ENOSPC (or EDQUOT) within the limit, that the box's filesystem gave
// no more than the limit (statfs, with slack for other writers on this machine), and that
// no file of the box outside the space's disk grew by more than its log lines.
func fill(t *testing.T, b *box, host, path string) int64 {
	t.Helper()
	state := filepath.Join(b.dir, "state")
	before, tree := freeBytes(t, state), allocated(t, b.dir)
	a := b.try(host, "fill", url.Values{"path": {path}, "mb": {strconv.Itoa(fillAttempt >> 20)}})
	moved, grown := before-freeBytes(t, state), allocated(t, b.dir)-tree
	n, _ := strconv.ParseInt(a.Out, 10, 64)
	t.Logf("%s wrote %d bytes to %s before: %s (the box's filesystem moved by %d bytes, the box's files by %d)", host, n, path, a.Err, moved, grown)
	if a.OK || !(strings.Contains(a.Err, "no space left on device") || strings.Contains(a.Err, "disk quota exceeded")) {
		t.Fatalf("filling %s: %+v, want ENOSPC or EDQUOT", path, a)
	}
	if n > diskLimit {
		t.Errorf("wrote %d bytes past a %d-byte disk", n, diskLimit)
	}
	if moved > diskLimit+fillAttempt/4 {
		t.Errorf("the box's filesystem lost %d bytes to a space with a %d-byte disk", moved, diskLimit)
	}
	if grown > 1<<20 {
		t.Errorf("the box's own files grew by %d bytes while the space filled its disk", grown)
	}
	return n
}

// sleepNow checkpoints host's space and stops it: a route that stops hibernating is put
// to sleep here (box.settle), then it hibernates again.
func sleepNow(t *testing.T, b *box, host string) {
	t.Helper()
	b.mustAdmin("POST", "/lchat/routes/"+host+"/hibernate", map[string]any{"hibernate": false, "upstream": "127.0.0.1:9"}, nil)
	if st := b.status(host); st.State != "asleep" {
		t.Fatalf("%s is %q after its checkpoint, want asleep", host, st.State)
	}
	b.mustAdmin("POST", "/lchat/routes/"+host+"/hibernate", map[string]any{"hibernate": true}, nil)
}

// TestDiskLimitStopsTheSpaceNotTheBox: a space of a kind with limits.disk fills its /tmp
// and then its data dir; each write stops at the limit with ENOSPC while the box's
// filesystem keeps its space; once the space deletes, it writes again. A checkpoint of
// the space at its limit, and a restore of it over a data dir at the limit, keep the
// data intact.
func TestDiskLimitStopsTheSpaceNotTheBox(t *testing.T) {
	needRoot(t)
	b := startIsoBox(t)
	const host = "d.localhost"
	wake(t, b, host)
	data := filepath.Join(b.dir, "state", "spaces", "spaces", host, "data")
	var fs unix.Statfs_t
	if err := unix.Statfs(data, &fs); err != nil || fs.Type != unix.EXT4_SUPER_MAGIC || int64(fs.Blocks)*fs.Bsize > diskLimit {
		t.Fatalf("the data dir is not on a disk of its own: statfs %+v, %v", fs, err)
	}

	// /tmp and the data dir share the one limit.
	fill(t, b, host, "/tmp/big")
	if n := fill(t, b, host, "$LCHAT_DATA_DIR/more"); n >= 1<<20 {
		t.Fatalf("the data dir took %d bytes more while /tmp had filled the disk", n)
	}
	for _, p := range []string{"/tmp/big", "$LCHAT_DATA_DIR/more"} {
		if a := b.try(host, "remove", url.Values{"path": {p}}); !a.OK {
			t.Fatal(a.Err)
		}
	}
	if a := b.try(host, "write", url.Values{"path": {"$LCHAT_DATA_DIR/marker"}}); !a.OK {
		t.Fatalf("writing after deleting: %s", a.Err)
	}
	sizeA := fill(t, b, host, "$LCHAT_DATA_DIR/big")

	// A checkpoint at the limit (generation A), then the space frees its file and fills the
	// disk again under another name (generation B).
	sleepNow(t, b, host)
	wake(t, b, host)
	if a := b.try(host, "read", url.Values{"path": {"$LCHAT_DATA_DIR"}}); a.Out != "big,marker" {
		t.Fatalf("after a checkpoint at the limit and a wake, the data dir holds %q", a.Out)
	}
	if a := b.try(host, "remove", url.Values{"path": {"$LCHAT_DATA_DIR/big"}}); !a.OK {
		t.Fatal(a.Err)
	}
	fill(t, b, host, "$LCHAT_DATA_DIR/other")
	sleepNow(t, b, host)

	// Restoring generation A replaces a full data dir with another full one.
	var hist struct {
		Checkpoints []struct {
			Generation int64 `json:"generation"`
		} `json:"checkpoints"`
	}
	b.mustAdmin("GET", "/lchat/routes/"+host+"/history", nil, &hist)
	if len(hist.Checkpoints) < 2 {
		t.Fatalf("history: %+v", hist)
	}
	genA := hist.Checkpoints[len(hist.Checkpoints)-2].Generation
	b.mustAdmin("POST", "/lchat/routes/"+host+"/restore", map[string]string{"at": strconv.FormatInt(genA, 10)}, nil)
	wake(t, b, host)
	if a := b.try(host, "read", url.Values{"path": {"$LCHAT_DATA_DIR"}}); a.Out != "big,marker" {
		t.Fatalf("restored data dir holds %q, want big,marker", a.Out)
	}
	if a := b.try(host, "read", url.Values{"path": {"$LCHAT_DATA_DIR/marker"}}); a.Out != "written by "+host {
		t.Fatalf("restored marker: %+v", a)
	}
	fi, err := os.Stat(filepath.Join(data, "big"))
	if err != nil || fi.Size() != sizeA {
		t.Fatalf("restored big file: %v, %v; want %d bytes", fi, err, sizeA)
	}
	// The restored space writes again once it deletes.
	if a := b.try(host, "remove", url.Values{"path": {"$LCHAT_DATA_DIR/big"}}); !a.OK {
		t.Fatal(a.Err)
	}
	if a := b.try(host, "write", url.Values{"path": {"/tmp/after"}}); !a.OK {
		t.Fatalf("writing after the restore: %s", a.Err)
	}
	var st struct {
		Counters map[string]float64 `json:"counters"`
	}
	b.mustAdmin("GET", "/lchat/status", nil, &st)
	if out, _ := json.Marshal(st.Counters); st.Counters["crashes"] != 0 {
		t.Errorf("counters %s", out)
	}
}

// TestPrivateTmpPerSpace: the /tmp an instance sees is neither the box's (a file the test
// puts there is not visible; a file the instance writes there does not appear in it) nor
// another space's.
func TestPrivateTmpPerSpace(t *testing.T) {
	needRoot(t)
	b := startIsoBox(t)
	wake(t, b, "a.localhost")
	wake(t, b, "b.localhost")
	mark := "lchat-iso-" + filepath.Base(b.dir)
	boxFile := filepath.Join("/tmp", mark+".box")
	if err := os.WriteFile(boxFile, []byte("the box's"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(boxFile)
	// The control: the file is there for anyone who shares the box's /tmp.
	if _, err := os.Stat(boxFile); err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"a.localhost", "b.localhost"} {
		if a := b.try(host, "read", url.Values{"path": {boxFile}}); a.OK {
			t.Errorf("%s reads the box's /tmp: %q", host, a.Out)
		}
		if a := b.try(host, "read", url.Values{"path": {"/tmp"}}); strings.Contains(a.Out, mark+".box") {
			t.Errorf("%s lists the box's /tmp: %q", host, a.Out)
		}
	}
	aFile := filepath.Join("/tmp", mark+".a")
	if a := b.try("a.localhost", "write", url.Values{"path": {aFile}}); !a.OK {
		t.Fatalf("a writing its /tmp: %s", a.Err)
	}
	defer os.Remove(aFile)
	if a := b.try("a.localhost", "read", url.Values{"path": {aFile}}); !a.OK || a.Out != "written by a.localhost" {
		t.Fatalf("control: a reading its own /tmp file: %+v", a)
	}
	if _, err := os.Stat(aFile); err == nil {
		t.Error("the file a wrote to its /tmp appeared in the box's /tmp")
	}
	if a := b.try("b.localhost", "read", url.Values{"path": {aFile}}); a.OK {
		t.Errorf("b reads a's /tmp: %q", a.Out)
	}
	if a := b.try("a.localhost", "write", url.Values{"path": {"/var/tmp/" + mark}}); !a.OK {
		t.Fatalf("a writing its /var/tmp: %s", a.Err)
	}
	if _, err := os.Stat("/var/tmp/" + mark); err == nil {
		os.Remove("/var/tmp/" + mark)
		t.Error("the file a wrote to its /var/tmp appeared in the box's /var/tmp")
	}
	if !strings.Contains(b.logs.String(), `"private_tmp":true`) {
		t.Error("the box does not log the kinds' private /tmp")
	}
}

// onOwnDisk reports whether path is on an ext4 filesystem (a space's disk), not the box's.
func onOwnDisk(t *testing.T, path string) bool {
	t.Helper()
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		t.Fatal(err)
	}
	var box unix.Statfs_t
	unix.Statfs(filepath.Dir(path), &box)
	return fs.Type == unix.EXT4_SUPER_MAGIC && fs.Fsid != box.Fsid
}

// loopsBackedBy lists the loop devices whose backing file is image.
func loopsBackedBy(image string) []string {
	var out []string
	ms, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, m := range ms {
		if b, err := os.ReadFile(m); err == nil && strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == image {
			out = append(out, m)
		}
	}
	return out
}

// TestDiskAfterABoxCrash: a box killed with a space awake leaves its disk mounted (no
// systemd namespace ends it here); the next box on the same state dir unmounts it as it
// starts, its loop device clears, and the space wakes on the same image, one mount, with
// its checkpointed data.
func TestDiskAfterABoxCrash(t *testing.T) {
	needRoot(t)
	b := startIsoBox(t)
	const host = "d.localhost"
	state := filepath.Join(b.dir, "state", "spaces")
	data := filepath.Join(state, "spaces", host, "data")
	image := filepath.Join(state, "disks", host+".img")
	wake(t, b, host)
	if a := b.try(host, "write", url.Values{"path": {"$LCHAT_DATA_DIR/marker"}}); !a.OK {
		t.Fatal(a.Err)
	}
	sleepNow(t, b, host)
	wake(t, b, host)
	if !onOwnDisk(t, data) || len(loopsBackedBy(image)) != 1 {
		t.Fatalf("awake: data dir on its disk %v, loops %v", onOwnDisk(t, data), loopsBackedBy(image))
	}
	b.cmd.Process.Kill()
	<-b.done
	if !onOwnDisk(t, data) {
		t.Fatal("control: the killed box's disk is no longer mounted; nothing is left to tidy")
	}
	b2 := restartIsoBox(t, b.dir)
	if onOwnDisk(t, data) {
		t.Fatal("the next box did not unmount the dead box's disk")
	}
	harness.WaitFor(t, 10*time.Second, "the dead box's loop device to clear", func() bool { return len(loopsBackedBy(image)) == 0 })
	wake(t, b2, host)
	if a := b2.try(host, "read", url.Values{"path": {"$LCHAT_DATA_DIR/marker"}}); a.Out != "written by "+host {
		t.Fatalf("after the crash: %+v", a)
	}
	if !onOwnDisk(t, data) || len(loopsBackedBy(image)) != 1 {
		t.Fatalf("after the crash: data dir on its disk %v, loops %v", onOwnDisk(t, data), loopsBackedBy(image))
	}
}
