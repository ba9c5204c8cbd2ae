package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// PIDNamespace is how an instance is started as pid 1 of a PID namespace of its own, so
// that a socket-activated instance's LISTEN_PID=1 names its own pid: Go sets no variable
// after the fork, and an exec shim would cost a whole wake's budget.
type PIDNamespace struct {
	// User is set when the box lacks CAP_SYS_ADMIN: the namespace is created inside a
	// new user namespace that maps the box's own uid and gid to themselves (one id
	// each), which an unprivileged user may do where the kernel allows it. Such a start
	// cannot switch uids.
	User bool
}

// Apply adds the namespace to attr.
func (ns PIDNamespace) Apply(attr *syscall.SysProcAttr) {
	attr.Cloneflags |= syscall.CLONE_NEWPID
	if ns.User {
		uid, gid := os.Getuid(), os.Getgid()
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		attr.GidMappingsEnableSetgroups = false
	}
}

// CheckPIDNamespace reports how this box can start instances in a PID namespace of their
// own: with CAP_SYS_ADMIN directly, else inside an unprivileged user namespace (the
// instance keeps the box's uid). It tries once per process, by starting `true` that way,
// and the error names why neither works.
var CheckPIDNamespace = sync.OnceValues(func() (PIDNamespace, error) {
	var ns PIDNamespace
	if requireCap(CapSysAdmin, "") == nil {
		if err := tryPIDNamespace(ns); err != nil {
			return ns, fmt.Errorf("starting a process in a PID namespace of its own: %v (under systemd, RestrictNamespaces= must allow pid)", err)
		}
		return ns, nil
	}
	ns.User = true
	if err := tryPIDNamespace(ns); err != nil {
		why := err.Error()
		if b, rerr := os.ReadFile("/proc/sys/kernel/unprivileged_userns_clone"); rerr == nil && strings.TrimSpace(string(b)) == "0" {
			why = "kernel.unprivileged_userns_clone is 0"
		} else if b, rerr := os.ReadFile("/proc/sys/user/max_user_namespaces"); rerr == nil && strings.TrimSpace(string(b)) == "0" {
			why = "user.max_user_namespaces is 0"
		}
		return ns, fmt.Errorf("this box lacks CAP_SYS_ADMIN (a PID namespace of its own per instance) and cannot use an unprivileged user namespace instead: %s", why)
	}
	return ns, nil
})

func tryPIDNamespace(ns PIDNamespace) error {
	bin, err := exec.LookPath("true")
	if err != nil {
		return fmt.Errorf("no `true` to probe with: %v", err)
	}
	cmd := exec.Command(bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	ns.Apply(cmd.SysProcAttr)
	if err := cmd.Run(); err != nil {
		return err
	}
	return nil
}

// SignalCaught reports whether process pid has a handler installed for sig (SigCgt in
// /proc/<pid>/status). The init process of a PID namespace ignores every signal it has
// no handler for, SIGTERM included, so a stop must not wait for a signal that cannot act.
func SignalCaught(pid int, sig syscall.Signal) (bool, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "SigCgt:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return false, fmt.Errorf("reading SigCgt of %d: %v", pid, err)
			}
			return mask&(1<<(uint(sig)-1)) != 0, nil
		}
	}
	return false, errors.New("no SigCgt in /proc/" + strconv.Itoa(pid) + "/status")
}
