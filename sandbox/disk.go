package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// MinDiskBytes is the smallest disk a space can be given: below it ext4's own metadata
// (superblocks, inode tables, a journal) leaves too little for the space's files.
const MinDiskBytes = 16 << 20

// mkfsExt4 is the program that formats the images, looked up in PATH.
const mkfsExt4 = "mkfs.ext4"

// CheckDisks reports whether this box can give spaces disks of their own: it needs
// CAP_SYS_ADMIN (loop devices and mounts), /dev/loop-control and mkfs.ext4 (e2fsprogs).
// The error names everything that is missing.
func CheckDisks() error {
	var missing []string
	if m, err := MissingCaps(CapSysAdmin); err != nil {
		return err
	} else if len(m) > 0 {
		missing = append(missing, "CAP_SYS_ADMIN (AmbientCapabilities= in the systemd unit, or run as root)")
	}
	if fd, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
		missing = append(missing, fmt.Sprintf("/dev/loop-control (%v; under systemd DeviceAllow=/dev/loop-control rw and block-loop rw, without PrivateDevices=)", err))
	} else {
		unix.Close(fd)
	}
	if _, err := exec.LookPath(mkfsExt4); err != nil {
		missing = append(missing, "mkfs.ext4 (install e2fsprogs)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("limits.disk needs %s, which this box lacks", strings.Join(missing, ", "))
	}
	return nil
}

// Disks are the disk images of one state dir's spaces: a file <dir>/<name>.img per space,
// an ext4 filesystem of exactly the space's limit, attached to a loop device and mounted
// where the engine asks. A space writing past its limit gets ENOSPC inside its own
// filesystem; nothing outside it fills.
//
// The images are preallocated (fallocate), not sparse: a space's limit is disk the box
// has set aside, so a full host filesystem can never turn a space's write under its limit
// into an I/O error in the loop device (a sparse image overcommits, and a write the host
// cannot back fails at writeback, long after the space's write returned).
//
// An image stays attached and mounted while its space is on this box, across its sleeps;
// Detach unmounts it (the loop device clears itself: LO_FLAGS_AUTOCLEAR) and Remove
// deletes it. Disks holds an exclusive lock on dir while open, so OpenDisks knows that
// any mount of one of dir's images was left by a box that died, and unmounts it.
type Disks struct {
	dir  string
	lock *os.File // flock(LOCK_EX) held until Close

	// mu guards mounted; Attach, Detach and Close are its writers.
	mu      sync.Mutex
	mounted map[string]*Disk // by name
}

// Disk is one space's mounted image.
type Disk struct {
	Name  string
	Image string // the image file
	Mount string // where the image's root is mounted (root's, 0711)
	Bind  string // where Mount/data is bind-mounted too; "" for none
	Bytes int64  // the image's size: the space's limit when it was made
}

// DataDir is the space's data directory inside the image (0700, the space's).
func (d *Disk) DataDir() string { return filepath.Join(d.Mount, "data") }

// TmpDir is the space's /tmp inside the image (0700, the space's).
func (d *Disk) TmpDir() string { return filepath.Join(d.Mount, "tmp") }

// DiskSpec is what Attach makes and mounts for one space.
type DiskSpec struct {
	Name     string // a plain file name (the engine uses the host)
	Bytes    int64  // the image's size, at least MinDiskBytes
	UID, GID uint32 // the owner of data/ and tmp/
	Mount    string // the mount point of the image's root; created if missing
	// Bind, when set, is a directory that DataDir is bind-mounted on, so the space's data
	// dir keeps its path whether or not it has a disk of its own.
	Bind string
}

// OpenDisks opens the images in dir, creating it (0700), and tidies what a dead box left:
// mounts of dir's images (and with them their loop devices) and half-made images. It
// fails when another live box holds dir.
func OpenDisks(dir string) (*Disks, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %v", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the disks' lock: %v", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("the disk images in %s are in use by another live box", dir)
		}
		return nil, fmt.Errorf("locking %s: %v", dir, err)
	}
	d := &Disks{dir: dir, lock: lock, mounted: make(map[string]*Disk)}
	if err := d.sweep(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Dir is the directory of the images.
func (d *Disks) Dir() string { return d.dir }

// sweep unmounts every mount of one of d's images (a box that died left them: d holds
// the lock) and removes images that were never finished.
func (d *Disks) sweep() error {
	mounts, err := d.ownMounts()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if err := unmount(m); err != nil {
			return fmt.Errorf("tidying a dead box's disk at %s: %v", m, err)
		}
	}
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".img.new") {
			os.Remove(filepath.Join(d.dir, e.Name()))
		}
	}
	return nil
}

// ownMounts lists the mount points, deepest first, whose source is a loop device backed
// by an image in d.dir.
func (d *Disks) ownMounts() ([]string, error) {
	return mountsOfImages(func(backing string) bool { return filepath.Dir(backing) == d.dir })
}

// mountsOfImages lists the mount points (deepest first) in this mount namespace whose
// source is a loop device whose backing file matches.
func mountsOfImages(match func(backing string) bool) ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mountinfo: %v", err)
	}
	var out []string
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 5 || sep+2 >= len(f) {
			continue
		}
		src := f[sep+2]
		name, ok := strings.CutPrefix(src, "/dev/loop")
		if !ok {
			continue
		}
		if _, err := strconv.Atoi(name); err != nil {
			continue
		}
		b, err := os.ReadFile("/sys/block/loop" + name + "/loop/backing_file")
		if err != nil {
			continue
		}
		if match(strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")) {
			out = append(out, unescape(f[4]))
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}

// unmount unmounts path; a path that is not a mount point is no error. Something still
// using the mount makes it fail (EBUSY): the image may then not be mounted again, since
// two live mounts of one ext4 image (through two loop devices) would corrupt it.
func unmount(path string) error {
	err := unix.Unmount(path, unix.UMOUNT_NOFOLLOW)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil // not a mount point (any more)
	}
	return err
}

// unmountLazily is unmount, detaching a mount that is still used (the kernel frees the
// filesystem, and clears its loop device, when the last user goes). Only for an image
// that is deleted and never mounted again.
func unmountLazily(path string) error {
	err := unmount(path)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	}
	return err
}

func (d *Disks) image(name string) string { return filepath.Join(d.dir, name+".img") }

// Attach makes the space's image if it has none (fallocate, mkfs.ext4 -m 0), and mounts
// it unless it is mounted already: the second and later Attach of a space on this box
// cost a map lookup. It returns the disk, whose Bytes is the existing image's size when
// that differs from s.Bytes (an image is made once; a changed limit holds from the next
// time the space comes to this box).
func (d *Disks) Attach(s DiskSpec) (*Disk, error) {
	if s.Name == "" || s.Name == "." || s.Name == ".." || strings.ContainsAny(s.Name, "/\x00") {
		return nil, fmt.Errorf("invalid disk name %q", s.Name)
	}
	if s.Bytes < MinDiskBytes {
		return nil, fmt.Errorf("disk of %d bytes: the smallest is %d (16MiB)", s.Bytes, MinDiskBytes)
	}
	d.mu.Lock()
	if d.lock == nil {
		d.mu.Unlock()
		return nil, errors.New("disks closed")
	}
	if dk := d.mounted[s.Name]; dk != nil {
		d.mu.Unlock()
		if dk.Mount != s.Mount || dk.Bind != s.Bind {
			return nil, fmt.Errorf("disk %s is mounted at %s already", s.Name, dk.Mount)
		}
		return dk, nil
	}
	d.mu.Unlock()
	// Made and mounted without the lock: another space's wake, whose disk is mounted,
	// must not wait for this one's mkfs. The caller serializes Attach and Remove of one
	// name (the engine holds the space's operation lock).
	img := d.image(s.Name)
	fi, err := os.Stat(img)
	if errors.Is(err, fs.ErrNotExist) {
		if err := makeImage(img, s.Bytes); err != nil {
			return nil, err
		}
		fi, err = os.Stat(img)
	}
	if err != nil {
		return nil, err
	}
	dk := &Disk{Name: s.Name, Image: img, Mount: s.Mount, Bind: s.Bind, Bytes: fi.Size()}
	if err := mountImage(dk, s.UID, s.GID); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lock == nil { // closed meanwhile: nobody would unmount it
		for _, m := range []string{dk.Bind, dk.Mount} {
			if m != "" {
				unmount(m)
			}
		}
		return nil, errors.New("disks closed")
	}
	d.mounted[s.Name] = dk
	return dk, nil
}

// Has reports whether the space has an image here, mounted or not.
func (d *Disks) Has(name string) bool {
	_, err := os.Stat(d.image(name))
	return err == nil
}

// makeImage writes a formatted image of size bytes at path, whole or not at all: it is
// made under a temporary name and renamed once formatted and synced.
func makeImage(path string, size int64) error {
	tmp := path + ".new"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("creating disk image: %v", err)
	}
	defer os.Remove(tmp) // nothing once renamed
	err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	if err != nil {
		f.Close()
		return fmt.Errorf("reserving %d bytes for the disk image: %v", size, err)
	}
	f.Close()
	// nodiscard: mkfs would otherwise punch the reservation back out of the file.
	// lazy_*_init: the preallocated blocks read as zeros, so nothing needs zeroing.
	out, err := exec.Command(mkfsExt4, "-q", "-F", "-m", "0", "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", tmp).CombinedOutput()
	if err != nil {
		return fmt.Errorf("formatting the disk image: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if f, err := os.Open(tmp); err == nil {
		f.Sync()
		f.Close()
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil {
		dir.Sync()
		dir.Close()
	}
	return nil
}

// mountImage attaches dk's image to a free loop device and mounts it at dk.Mount (and its
// data/ at dk.Bind), with data/ and tmp/ made the space's.
func mountImage(dk *Disk, uid, gid uint32) (err error) {
	if err := os.MkdirAll(dk.Mount, 0o711); err != nil {
		return err
	}
	// A mount left here (by this box before a failed attach) would be mounted over.
	if err := unmount(dk.Mount); err != nil {
		return err
	}
	dev, loopFd, err := attachLoop(dk.Image)
	if err != nil {
		return err
	}
	// The mount holds the loop device; once it goes, LO_FLAGS_AUTOCLEAR detaches it.
	defer unix.Close(loopFd)
	if err := unix.Mount(dev, dk.Mount, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, "noinit_itable"); err != nil {
		return fmt.Errorf("mounting the disk image on %s: %v", dk.Mount, err)
	}
	defer func() {
		if err != nil {
			unmount(dk.Mount)
		}
	}()
	if err := os.Chmod(dk.Mount, 0o711); err != nil {
		return err
	}
	for _, sub := range []string{dk.DataDir(), dk.TmpDir()} {
		if err := os.Mkdir(sub, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := os.Lchown(sub, int(uid), int(gid)); err != nil {
			return err
		}
		if err := os.Chmod(sub, 0o700); err != nil {
			return err
		}
	}
	if dk.Bind == "" {
		return nil
	}
	if err := os.MkdirAll(dk.Bind, 0o700); err != nil {
		return err
	}
	if err := unmount(dk.Bind); err != nil {
		return err
	}
	if err := unix.Mount(dk.DataDir(), dk.Bind, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding the disk's data dir on %s: %v", dk.Bind, err)
	}
	return nil
}

// attachLoop binds image to a free loop device that clears itself once its last user
// (the mount) goes, and returns its path and an open descriptor of it.
func attachLoop(image string) (string, int, error) {
	img, err := unix.Open(image, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("opening the disk image: %v", err)
	}
	defer unix.Close(img)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("opening /dev/loop-control: %v", err)
	}
	defer unix.Close(ctl)
	var last error
	// Another process may take the free device between the question and the configure.
	for range 16 {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", -1, fmt.Errorf("finding a free loop device: %v", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", -1, fmt.Errorf("opening %s: %v", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img)}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)
		if err := unix.IoctlLoopConfigure(fd, &cfg); err != nil {
			unix.Close(fd)
			if errors.Is(err, unix.EBUSY) {
				last = err
				continue
			}
			return "", -1, fmt.Errorf("attaching the disk image to %s: %v", dev, err)
		}
		return dev, fd, nil
	}
	return "", -1, fmt.Errorf("attaching the disk image: no free loop device stayed free: %v", last)
}

// Detach unmounts the space's image (its loop device clears itself); the image stays.
// A disk that is not mounted is no error; one still in use stays mounted (an error).
func (d *Disks) Detach(name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.detachLocked(name, false)
}

func (d *Disks) detachLocked(name string, lazily bool) error {
	dk := d.mounted[name]
	if dk == nil {
		return nil
	}
	um := unmount
	if lazily {
		um = unmountLazily
	}
	var first error
	for _, m := range []string{dk.Bind, dk.Mount} {
		if m == "" {
			continue
		}
		if err := um(m); err != nil && first == nil {
			first = fmt.Errorf("unmounting %s: %v", m, err)
		}
	}
	if first == nil {
		delete(d.mounted, name)
	}
	return first
}

// Remove detaches the space's image and deletes it: the space has left this box. A mount
// still in use is detached lazily: the image is never mounted again.
func (d *Disks) Remove(name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.detachLocked(name, true); err != nil {
		return err
	}
	if err := os.Remove(d.image(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Mounted reports the disk of name if it is mounted.
func (d *Disks) Mounted(name string) *Disk {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mounted[name]
}

// Close detaches every image except those in keep (spaces whose instance still runs),
// keeping the files, and releases dir. Idempotent.
func (d *Disks) Close(keep ...string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lock == nil {
		return nil
	}
	var first error
	for name := range d.mounted {
		if slices.Contains(keep, name) {
			continue
		}
		if err := d.detachLocked(name, false); err != nil && first == nil {
			first = err
		}
	}
	d.lock.Close()
	d.lock = nil
	return first
}
