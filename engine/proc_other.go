//go:build !linux

package engine

import "syscall"

func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// waitUnreaped is not available here: the group is not killed after the leader exits,
// since after the reap its id may belong to another process.
func waitUnreaped(pid int) bool { return false }
