package engine

import "syscall"

// sysProcAttr puts the instance in its own process group and kills it if this box dies, so a
// crashed box leaves no instance writing a data dir nobody will checkpoint.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
