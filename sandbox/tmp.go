package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// tmpMounts are the directories an instance with a private /tmp sees its own tmp
// directory on.
var tmpMounts = []string{"/tmp", "/var/tmp"}

// enterPrivateTmp moves the calling thread, which must be locked to its goroutine and
// must never run other Go code again, into a mount namespace of its own where dir is
// bind-mounted on /tmp and /var/tmp (nosuid, nodev). The namespace is a slave of the
// box's: mounts and unmounts the box makes later (a space's disk going) still reach it,
// and nothing mounted in it reaches the box. A process forked from the thread starts
// inside; the namespace ends with its last process.
func enterPrivateTmp(dir string) error {
	// CLONE_FS: a Go thread shares its filesystem attributes with the others, and the
	// kernel refuses a new mount namespace to a thread that shares them.
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unsharing the mount namespace: %v", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making / a slave mount: %v", err)
	}
	src := dir
	for _, t := range tmpMounts {
		if fi, err := os.Lstat(t); err != nil || !fi.IsDir() {
			continue // a box without /var/tmp: nothing to hide there
		}
		// After the first bind, dir may be out of sight (a dir below /tmp): the next
		// bind copies the first.
		if err := unix.Mount(src, t, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding the space's tmp dir on %s: %v", t, err)
		}
		if err := unix.Mount("", t, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("remounting %s nosuid,nodev: %v", t, err)
		}
		src = t
	}
	return nil
}

// CheckPrivateTmp reports whether this box can start instances with a /tmp of their own
// (StartOptions.TmpDir): it needs CAP_SYS_ADMIN, and no seccomp filter or systemd
// RestrictNamespaces= may forbid the mount namespace or the mounts. It tries once, on a
// thread that ends afterwards, binding a scratch directory.
func CheckPrivateTmp() error {
	if err := requireCap(CapSysAdmin, "a private /tmp needs CAP_SYS_ADMIN, which this box lacks (grant it with AmbientCapabilities=, allow the namespace with RestrictNamespaces=mnt and the calls with SystemCallFilter=@mount in the systemd unit, or run as root)"); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "lchat-tmp-probe-")
	if err != nil {
		return fmt.Errorf("a private /tmp: %v", err)
	}
	defer os.Remove(dir)
	res := make(chan error, 1)
	// The thread, now in the probe's namespace, ends with the goroutine.
	onOwnThread(func() { res <- enterPrivateTmp(dir) })
	if err := <-res; err != nil {
		return fmt.Errorf("a private /tmp: %v (under systemd, RestrictNamespaces= must allow mnt and SystemCallFilter= @mount)", err)
	}
	return nil
}

// PrepareTmpDir makes dir the private /tmp of a space whose uid and gid are given: a
// directory (0700, the space's), emptied of what an earlier start left. Its parent must
// be the box's, so the space cannot swap dir for a link.
func PrepareTmpDir(dir string, uid, gid uint32) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if err := emptyDir(dir); err != nil {
		return fmt.Errorf("emptying the space's tmp dir: %v", err)
	}
	if err := os.Lchown(dir, int(uid), int(gid)); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// emptyDir removes what dir holds, never following a link; an empty dir costs one read.
func emptyDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}
