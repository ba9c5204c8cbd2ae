package sandbox

import "os/exec"

// StartHelper starts cmd, a short-lived helper the box runs under a space's uid (its
// SysProcAttr carries the credentials), outside any space's cgroup: it stays in the box's
// own group, so freezing the space's group while the helper reads does not stop the helper.
//
// Like Group.Start it forks from a dedicated OS thread that first empties its ambient and
// inheritable capability sets, so the helper holds no capability after the uid switch and
// execve even on a box granted capabilities through systemd's AmbientCapabilities, and that
// thread stays parked until release is called, because the kernel delivers
// SysProcAttr.Pdeathsig when the forking thread ends: call release once the helper has
// been reaped.
func StartHelper(cmd *exec.Cmd) (release func(), err error) {
	return startParked(func() error {
		if err := dropInheritableCaps(); err != nil {
			return err
		}
		return cmd.Start()
	})
}
