package sandbox

import (
	"errors"

	"golang.org/x/sys/unix"
)

// errClone3Filtered is the start-up refusal of a v2 tree on a box whose clone3 is
// filtered: every isolated wake would fail with "fork/exec ...: function not
// implemented".
var errClone3Filtered = errors.New("cgroup v2: clone3 is refused (ENOSYS) by a seccomp filter, and only clone3 starts an instance inside its group (CLONE_INTO_CGROUP); " +
	"under systemd, any RestrictNamespaces= blocks clone3 this way: remove it from the unit")

// checkClone3 returns errClone3Filtered when clone3 does not reach the kernel. Start
// enters a v2 group at the fork through clone3's CLONE_INTO_CGROUP, which clone cannot
// do; a seccomp filter that cannot read clone3's flags (they sit in memory, not in a
// register) answers ENOSYS so that libc falls back to clone: systemd does so for any
// RestrictNamespaces=, container runtimes for their default profiles. A size of 0
// makes the kernel refuse the call (EINVAL) before it does anything.
func checkClone3() error {
	if _, _, errno := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0); errno == unix.ENOSYS {
		return errClone3Filtered
	}
	return nil
}
