package sandbox

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// diskBox skips unless this box can make disks (root, loop devices, mkfs.ext4) and
// returns a directory of the test's own, reachable by other uids.
func diskBox(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	if err := CheckDisks(); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "disktest")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	t.Cleanup(func() {
		// Whatever the test left mounted from its images goes before the files do.
		if ms, _ := mountsOfImages(func(b string) bool { return strings.HasPrefix(b, dir+"/") }); len(ms) > 0 {
			t.Errorf("mounts left behind: %v", ms)
			for _, m := range ms {
				unix.Unmount(m, unix.MNT_DETACH)
			}
		}
		os.RemoveAll(dir)
	})
	return dir
}

// loopsOf lists the loop devices backed by image.
func loopsOf(image string) []string {
	var out []string
	ms, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, m := range ms {
		if b, err := os.ReadFile(m); err == nil && strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == image {
			out = append(out, m)
		}
	}
	return out
}

// noLoopsOf waits (the kernel clears an autoclear loop device once the filesystem's
// last mount is gone, which a namespace that is ending may hold a moment) until no loop
// device is backed by image.
func noLoopsOf(t *testing.T, image string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(loopsOf(image)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("loop devices still backed by %s: %v", image, loopsOf(image))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func isMount(t *testing.T, path string) bool {
	t.Helper()
	var st, parent unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false
	}
	if err := unix.Lstat(filepath.Dir(path), &parent); err != nil {
		t.Fatal(err)
	}
	return st.Dev != parent.Dev
}

// TestDiskImageLifecycle walks one space's image through its life on a box: made and
// mounted at the first attach (data/ and tmp/ the space's, data/ also on the bind path),
// kept across sleeps (a second attach is the same mount), detached at shutdown and
// mounted again with its files by the next box, left mounted by a box that died and
// tidied by the next one, and removed, loop device and all.
func TestDiskImageLifecycle(t *testing.T) {
	dir := diskBox(t)
	const uid = 3999940
	d, err := OpenDisks(filepath.Join(dir, "disks"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := OpenDisks(filepath.Join(dir, "disks")); err == nil || !strings.Contains(err.Error(), "another live box") {
		t.Fatalf("a second box on the same disks: %v", err)
	}
	spec := DiskSpec{Name: "a.example.com", Bytes: 32 << 20, UID: uid, GID: uid,
		Mount: filepath.Join(dir, "spaces/a/disk"), Bind: filepath.Join(dir, "spaces/a/data")}
	dk, err := d.Attach(spec)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dk.Image)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	unix.Stat(dk.Image, &st)
	if fi.Size() != spec.Bytes || st.Blocks*512 < spec.Bytes {
		t.Errorf("image of %d bytes, %d allocated: want %d, preallocated", fi.Size(), st.Blocks*512, spec.Bytes)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(spec.Bind, &fs); err != nil {
		t.Fatal(err)
	}
	if total := int64(fs.Blocks) * fs.Bsize; fs.Type != unix.EXT4_SUPER_MAGIC || total > spec.Bytes || total < spec.Bytes/2 {
		t.Errorf("data dir on fs type %#x of %d bytes, want ext4 of at most %d", fs.Type, total, spec.Bytes)
	}
	for _, sub := range []string{dk.DataDir(), dk.TmpDir(), spec.Bind} {
		var s unix.Stat_t
		if err := unix.Stat(sub, &s); err != nil {
			t.Fatal(err)
		}
		if s.Uid != uid || s.Gid != uid || s.Mode&0o777 != 0o700 {
			t.Errorf("%s: uid %d gid %d mode %o, want the space's, 0700", sub, s.Uid, s.Gid, s.Mode&0o777)
		}
	}
	if err := os.WriteFile(filepath.Join(spec.Bind, "kept"), []byte("yes"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dk.DataDir(), "kept")); err != nil || string(b) != "yes" {
		t.Fatalf("the bind path is not the image's data dir: %q, %v", b, err)
	}

	// A sleep and a wake: the disk is not touched again.
	again, err := d.Attach(spec)
	if err != nil || again != dk {
		t.Fatalf("second attach: %v, %v; want the mounted disk", again, err)
	}
	if n := len(loopsOf(dk.Image)); n != 1 {
		t.Fatalf("%d loop devices for one image", n)
	}

	// A clean shutdown keeps the image; the next box mounts it with its files.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if isMount(t, spec.Mount) || isMount(t, spec.Bind) {
		t.Fatal("still mounted after Close")
	}
	noLoopsOf(t, dk.Image)
	d, err = OpenDisks(filepath.Join(dir, "disks"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Attach(spec); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(spec.Bind, "kept")); err != nil || string(b) != "yes" {
		t.Fatalf("after a restart: %q, %v", b, err)
	}

	// A box that dies leaves its mounts (its lock goes with it); the next one tidies them,
	// and the half-made image it was writing.
	d.lock.Close()
	d.lock = nil
	half := filepath.Join(dir, "disks", "b.example.com.img.new")
	os.WriteFile(half, nil, 0o600)
	d, err = OpenDisks(filepath.Join(dir, "disks"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if isMount(t, spec.Mount) || isMount(t, spec.Bind) {
		t.Fatal("a dead box's mounts were not tidied")
	}
	noLoopsOf(t, dk.Image)
	if _, err := os.Stat(half); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("half-made image left: %v", err)
	}

	// The space leaves the box.
	if _, err := d.Attach(spec); err != nil {
		t.Fatal(err)
	}
	if err := d.Remove(spec.Name); err != nil {
		t.Fatal(err)
	}
	if isMount(t, spec.Mount) || isMount(t, spec.Bind) {
		t.Fatal("still mounted after Remove")
	}
	noLoopsOf(t, dk.Image)
	if _, err := os.Stat(dk.Image); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("image left after Remove: %v", err)
	}
}

// TestDiskRefusesTooSmall: ext4 cannot hold a space's files in a few kilobytes.
func TestDiskRefusesTooSmall(t *testing.T) {
	dir := diskBox(t)
	d, err := OpenDisks(filepath.Join(dir, "disks"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_, err = d.Attach(DiskSpec{Name: "a", Bytes: 10 << 10, Mount: filepath.Join(dir, "m")})
	if err == nil || !strings.Contains(err.Error(), "the smallest is") {
		t.Fatalf("a 10KiB disk: %v", err)
	}
}

// TestDiskStopsTheSpaceNotTheBox: the space's uid writes into its data dir until the
// image is full; the write fails with ENOSPC, the filesystem of the images moved by no
// more than the image, and once the space deletes a file it writes again.
func TestDiskStopsTheSpaceNotTheBox(t *testing.T) {
	dir := diskBox(t)
	const uid = 3999941
	d, err := OpenDisks(filepath.Join(dir, "disks"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dk, err := d.Attach(DiskSpec{Name: "w", Bytes: 24 << 20, UID: uid, GID: uid, Mount: filepath.Join(dir, "w")})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Remove("w")
	free := func() int64 {
		var fs unix.Statfs_t
		unix.Statfs(dir, &fs)
		return int64(fs.Bavail) * fs.Bsize
	}
	before := free()
	sh := func(script string) (string, error) {
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.Dir = dk.DataDir()
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := sh("dd if=/dev/zero of=big bs=1M count=64 conv=fsync")
	if err == nil || !strings.Contains(out, "No space left on device") {
		t.Fatalf("writing 64MiB into a 24MiB disk: %v: %s", err, out)
	}
	if moved := before - free(); moved > dk.Bytes+1<<20 {
		t.Errorf("the host filesystem lost %d bytes to a %d-byte disk", moved, dk.Bytes)
	}
	if out, err := sh("rm big && dd if=/dev/zero of=small bs=1M count=4 conv=fsync"); err != nil {
		t.Fatalf("writing after deleting: %v: %s", err, out)
	}
}

// BenchmarkDiskFirstAttach measures what a space's first start on a box pays for a disk
// of 256MiB (fallocate, mkfs.ext4, loop device, mount, the data dir bound), a later
// mount of the existing image (a box restarted), and the removal when the space leaves.
// go test ./sandbox -run '^$' -bench DiskFirstAttach -benchtime 20x (root).
func BenchmarkDiskFirstAttach(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (CI runs as root)")
	}
	if err := CheckDisks(); err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "diskbench")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	d, err := OpenDisks(filepath.Join(dir, "disks"))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	spec := DiskSpec{Name: "bench", Bytes: 256 << 20, UID: 3999942, GID: 3999942,
		Mount: filepath.Join(dir, "disk"), Bind: filepath.Join(dir, "data")}
	var made, mounted, removed time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := d.Attach(spec); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := d.Detach(spec.Name); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if _, err := d.Attach(spec); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		if err := d.Remove(spec.Name); err != nil {
			b.Fatal(err)
		}
		made, mounted, removed = made+t1.Sub(t0), mounted+t3.Sub(t2), removed+time.Since(t3)
	}
	n := float64(b.N)
	b.ReportMetric(float64(made.Microseconds())/n/1000, "ms/make+mount")
	b.ReportMetric(float64(mounted.Microseconds())/n/1000, "ms/mount")
	b.ReportMetric(float64(removed.Microseconds())/n/1000, "ms/remove")
}
