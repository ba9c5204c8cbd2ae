package engine

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// sysProcAttr puts the instance in its own process group and kills it if this box dies, so a
// crashed box leaves no instance writing a data dir nobody will checkpoint.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// waitUnreaped blocks until process pid has exited and leaves it unreaped (a zombie, so its
// pid is not reused until Wait reaps it). It reports false if it could not wait.
func waitUnreaped(pid int) bool {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		return err == nil
	}
}
