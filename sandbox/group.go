package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/internal/backoff"
)

// Group is one space's cgroup, in every hierarchy the box uses.
type Group struct {
	c    *Cgroups
	name string
	v2   string   // the v2 group directory; "" without a v2 tree
	v1   []string // the v1 group directories, one per controller joined
	// members is where membership is read: the v2 group, else the v1 freezer group.
	members string
	// memEvents is the file counting OOM kills: v2 memory.events or v1 memory.oom_control.
	memEvents string
}

// Create makes (or empties and reuses) the group of one space and applies its limits.
// name must be a plain file name (the engine uses the host).
func (c *Cgroups) Create(name string, l Limits) (*Group, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return nil, fmt.Errorf("invalid cgroup name %q", name)
	}
	if err := c.Check(l); err != nil {
		return nil, err
	}
	g := &Group{c: c, name: name}
	mk := func(dir string) error {
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating cgroup %s: %v", dir, err)
		}
		return nil
	}
	// The parents may have been removed by Close (another engine of this process).
	for _, dir := range c.parents() {
		if err := mk(dir); err != nil {
			return nil, err
		}
	}
	if c.v2 != "" && len(c.v2ctrl) > 0 {
		writeFile(filepath.Join(c.v2, c.name, "cgroup.subtree_control"), c.v2Enable())
	}
	if c.v2 != "" {
		g.v2 = filepath.Join(c.v2, c.name, name)
		if err := mk(g.v2); err != nil {
			return nil, err
		}
		g.members = g.v2
	}
	for _, ctrl := range c.v1For(l) {
		dir := filepath.Join(c.v1[ctrl], c.name, name)
		if err := mk(dir); err != nil {
			g.Remove()
			return nil, err
		}
		g.v1 = append(g.v1, dir)
		if ctrl == ctrlFreezer && g.members == "" {
			g.members = dir
		}
		if ctrl == ctrlMemory {
			g.memEvents = filepath.Join(dir, "memory.oom_control")
		}
	}
	if c.v2ctrl[ctrlMemory] {
		g.memEvents = filepath.Join(g.v2, "memory.events")
	}
	// A group left by a failed stop must not hand old processes to the new instance.
	if len(g.Pids()) > 0 {
		if err := g.Kill(); err != nil {
			return nil, err
		}
	}
	if err := g.apply(l); err != nil {
		g.Remove()
		return nil, err
	}
	return g, nil
}

// apply writes the limits, or clears them when zero (a reused group keeps no old limit).
func (g *Group) apply(l Limits) error {
	c := g.c
	dir := func(ctrl string) (string, bool) {
		if c.v2ctrl[ctrl] {
			return g.v2, true
		}
		return filepath.Join(c.v1[ctrl], c.name, g.name), false
	}
	// A v1 controller the group did not join (v1For: no limit) has nothing to set.
	inV1 := func(ctrl string) bool {
		return c.v1[ctrl] != "" && slices.Contains(g.v1, filepath.Join(c.v1[ctrl], c.name, g.name))
	}
	set := func(path, v string) error {
		if err := writeFile(path, v); err != nil {
			return fmt.Errorf("setting %s: %v", filepath.Base(path), err)
		}
		return nil
	}
	optional := func(path, v string) {
		if _, err := os.Stat(path); err == nil {
			writeFile(path, v)
		}
	}
	if c.v2ctrl[ctrlMemory] || inV1(ctrlMemory) {
		d, v2 := dir(ctrlMemory)
		if v2 {
			v := "max"
			if l.MemoryBytes > 0 {
				v = strconv.FormatInt(l.MemoryBytes, 10)
				// A limit that spills into swap is not a limit.
				optional(filepath.Join(d, "memory.swap.max"), "0")
			} else {
				optional(filepath.Join(d, "memory.swap.max"), "max")
			}
			if err := set(filepath.Join(d, "memory.max"), v); err != nil {
				return err
			}
		} else {
			v := "-1"
			if l.MemoryBytes > 0 {
				v = strconv.FormatInt(l.MemoryBytes, 10)
			}
			// memsw may not go below the memory limit: raise order matters.
			optional(filepath.Join(d, "memory.memsw.limit_in_bytes"), "-1")
			if err := set(filepath.Join(d, "memory.limit_in_bytes"), v); err != nil {
				return err
			}
			optional(filepath.Join(d, "memory.memsw.limit_in_bytes"), v)
		}
	}
	if c.v2ctrl[ctrlCPU] || inV1(ctrlCPU) {
		const period = 100000
		d, v2 := dir(ctrlCPU)
		quota := int64(-1)
		if l.CPU > 0 {
			quota = max(int64(math.Round(l.CPU*period)), 1000)
		}
		if v2 {
			v := "max " + strconv.Itoa(period)
			if quota > 0 {
				v = fmt.Sprintf("%d %d", quota, period)
			}
			if err := set(filepath.Join(d, "cpu.max"), v); err != nil {
				return err
			}
		} else {
			if err := set(filepath.Join(d, "cpu.cfs_period_us"), strconv.Itoa(period)); err != nil {
				return err
			}
			if err := set(filepath.Join(d, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)); err != nil {
				return err
			}
		}
	}
	if c.v2ctrl[ctrlPids] || inV1(ctrlPids) {
		d, _ := dir(ctrlPids)
		v := "max"
		if l.Pids > 0 {
			v = strconv.FormatInt(l.Pids, 10)
		}
		if err := set(filepath.Join(d, "pids.max"), v); err != nil {
			return err
		}
	}
	return nil
}

// StartOptions are the parts of an instance's confinement set up on its forking thread.
type StartOptions struct {
	// EmptyNetwork starts the instance in a network namespace of its own whose only
	// interface is an up loopback (network none; see CheckEmptyNetwork).
	EmptyNetwork bool
	// TmpDir, when set, is the instance's /tmp and /var/tmp: the forking thread enters a
	// mount namespace of its own (a slave of the box's) and bind-mounts TmpDir on both,
	// nosuid and nodev, so the instance never sees the box's /tmp nor another space's
	// (see CheckPrivateTmp). The directory must be the space's and its parent the box's
	// (PrepareTmpDir).
	TmpDir string
}

// Start starts cmd with every process it will ever have inside the group.
//
// It forks from a dedicated OS thread that first drops its ambient capabilities (a box
// granted capabilities through systemd's AmbientCapabilities would otherwise hand them
// to the instance across the execve: a uid switch between two non-zero uids keeps them),
// joins the group's v1 hierarchies for the fork only (the child inherits its thread's
// groups, so it is inside before any of its code runs; a v2 group is entered atomically
// by clone3), and leaves them again. The thread then stays parked until release is
// called, because the kernel delivers SysProcAttr.Pdeathsig when the forking thread
// ends, not the process: call release once the process has been reaped. With
// opt.EmptyNetwork the thread moves into a new network namespace first, so the
// instance starts inside it; the namespace ends with the instance's last process. With
// opt.TmpDir it then moves into a mount namespace of its own with TmpDir on /tmp.
func (g *Group) Start(cmd *exec.Cmd, opt StartOptions) (release func(), err error) {
	// The thread's changed capabilities, groups and namespaces die with it.
	return startParked(func() error { return g.startLocked(cmd, opt) })
}

func (g *Group) startLocked(cmd *exec.Cmd, opt StartOptions) error {
	if err := dropInheritableCaps(); err != nil {
		return err
	}
	if opt.EmptyNetwork {
		if err := enterEmptyNetwork(); err != nil {
			return err
		}
	}
	if opt.TmpDir != "" {
		if err := enterPrivateTmp(opt.TmpDir); err != nil {
			return err
		}
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if g.v2 != "" {
		fd, err := unix.Open(g.v2, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening cgroup %s: %v", g.v2, err)
		}
		defer unix.Close(fd)
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = fd
	}
	tid := strconv.Itoa(unix.Gettid())
	var joined []string // v1 hierarchies (own group dirs) this thread must leave again
	leave := func() error {
		var first error
		for _, own := range joined {
			if err := writeFile(filepath.Join(own, "tasks"), tid); err != nil && first == nil {
				first = fmt.Errorf("leaving cgroup: %v", err)
			}
		}
		return first
	}
	for _, dir := range g.v1 {
		if err := writeFile(filepath.Join(dir, "tasks"), tid); err != nil {
			leave()
			return fmt.Errorf("joining cgroup %s: %v", dir, err)
		}
		joined = append(joined, filepath.Dir(filepath.Dir(dir)))
	}
	err := cmd.Start()
	if lerr := leave(); lerr != nil && err == nil {
		// This thread still counts in the space's groups: a kill of the group would
		// reach the box. End the instance; this thread ends with the goroutine.
		cmd.Process.Kill()
		cmd.Wait()
		return lerr
	}
	return err
}

// dropInheritableCaps empties this thread's ambient and inheritable sets, keeping its
// effective ones: the instance then holds no capability after the execve, whatever file
// capabilities the binaries it runs carry.
func dropInheritableCaps() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("dropping ambient capabilities: %v", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading capabilities: %v", err)
	}
	if data[0].Inheritable == 0 && data[1].Inheritable == 0 {
		return nil
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("dropping inheritable capabilities: %v", err)
	}
	return nil
}

// Pids lists the processes in the group. The kernel leaves a process that has exited
// out of cgroup.procs even before its parent reaps it, and reading cgroup.procs needs no
// /proc access (hidden by ProtectProc=invisible).
func (g *Group) Pids() []int {
	if g.members == "" {
		return nil
	}
	data, err := os.ReadFile(filepath.Join(g.members, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for f := range strings.FieldsSeq(string(data)) {
		pid, err := strconv.Atoi(f)
		if err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// Kill ends every process in the group, including those that left the instance's
// process group or session (setsid, double fork), and waits until none is left.
func (g *Group) Kill() error {
	if g.v2 != "" && writeFile(filepath.Join(g.v2, "cgroup.kill"), "1") == nil {
		return g.waitEmpty(10 * time.Second)
	}
	freeze, thaw := func() {}, func() {}
	if g.v2 != "" {
		freeze = func() { writeFile(filepath.Join(g.v2, "cgroup.freeze"), "1") }
		thaw = func() { writeFile(filepath.Join(g.v2, "cgroup.freeze"), "0") }
	} else if g.members != "" && fileExists(filepath.Join(g.members, "freezer.state")) {
		st := filepath.Join(g.members, "freezer.state")
		freeze = func() {
			writeFile(st, "FROZEN")
			for i := 0; i < 200; i++ {
				if b, _ := os.ReadFile(st); strings.TrimSpace(string(b)) == "FROZEN" {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		thaw = func() { writeFile(st, "THAWED") }
	}
	// A frozen group cannot fork; a SIGKILL is delivered at the thaw.
	for range 50 {
		freeze()
		pids := g.Pids()
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		thaw()
		if len(pids) == 0 {
			return nil
		}
		if g.waitEmpty(200*time.Millisecond) == nil {
			return nil
		}
	}
	return fmt.Errorf("cgroup %s still has processes after kill", g.members)
}

// waitEmpty waits until no process is left in the group, at most d: on a v2 group on the
// kernel's word (cgroup.events "populated 0", waitEvents); v1 has no such event, so its
// membership is polled.
func (g *Group) waitEmpty(d time.Duration) error {
	if g.v2 != "" && g.members == g.v2 {
		if err := waitEvents(filepath.Join(g.v2, "cgroup.events"), "populated 0", d); err != nil {
			return fmt.Errorf("cgroup %s still has processes: %v", g.members, err)
		}
		return nil
	}
	deadline := time.Now().Add(d)
	for {
		if len(g.Pids()) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still has processes", g.members)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Freeze stops every process of the group where it stands until Thaw, and waits until
// they are all stopped. While frozen no instance code runs, so the box can read the
// space's files without the instance swapping names under it.
func (g *Group) Freeze() error {
	switch {
	case g.v2 != "":
		if err := writeFile(filepath.Join(g.v2, "cgroup.freeze"), "1"); err != nil {
			return fmt.Errorf("freezing %s: %v", g.v2, err)
		}
		return g.waitState(filepath.Join(g.v2, "cgroup.events"), "frozen 1")
	case g.members != "" && fileExists(filepath.Join(g.members, "freezer.state")):
		st := filepath.Join(g.members, "freezer.state")
		if err := writeFile(st, "FROZEN"); err != nil {
			return fmt.Errorf("freezing %s: %v", g.members, err)
		}
		return g.waitState(st, "FROZEN")
	}
	return errors.New("this group has no freezer")
}

// Thaw lets a frozen group run again.
func (g *Group) Thaw() error {
	switch {
	case g.v2 != "":
		return writeFile(filepath.Join(g.v2, "cgroup.freeze"), "0")
	case g.members != "" && fileExists(filepath.Join(g.members, "freezer.state")):
		return writeFile(filepath.Join(g.members, "freezer.state"), "THAWED")
	}
	return nil
}

// waitState waits until the file at path says want, at most 10 s, thawing the group if it
// never does: a v2 cgroup.events file on the kernel's word (waitEvents), v1's freezer.state
// (which has no event) polled.
func (g *Group) waitState(path, want string) error {
	if filepath.Base(path) == "cgroup.events" {
		if err := waitEvents(path, want, 10*time.Second); err != nil {
			g.Thaw()
			return err
		}
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil && (strings.TrimSpace(string(b)) == want || strings.Contains(string(b), want+"\n")) {
			return nil
		}
		if time.Now().After(deadline) {
			g.Thaw()
			return fmt.Errorf("%s did not reach %q", path, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// OOMKills reports how many processes the kernel killed in the group for exceeding
// its memory limit.
func (g *Group) OOMKills() int {
	if g.memEvents == "" {
		return 0
	}
	data, err := os.ReadFile(g.memEvents)
	if err != nil {
		return 0
	}
	for line := range bytes.Lines(data) {
		if v, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("oom_kill ")); ok {
			n, _ := strconv.Atoi(string(v))
			return n
		}
	}
	return 0
}

// removeTries and removeBackoff space the tries of a group directory's removal: the
// kernel refuses it (EBUSY) for a moment after the last process left, 20 tries over about
// a second.
const removeTries = 20

var removeBackoff = backoff.Curve{First: 10 * time.Millisecond, Max: 80 * time.Millisecond}

// Remove deletes the group's directories; it fails while processes remain.
func (g *Group) Remove() error {
	var first error
	for _, dir := range append(append([]string{}, g.v1...), g.v2) {
		if dir == "" {
			continue
		}
		var err error
		for try := 1; try <= removeTries; try++ {
			if err = os.Remove(dir); err == nil || errors.Is(err, fs.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(removeBackoff.After(try))
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Path is the group's membership directory, for logs.
func (g *Group) Path() string { return g.members }

func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

func unixAccessW(path string) bool { return unix.Access(path, unix.W_OK) == nil }

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// waitEvents waits until the cgroup v2 events file at path has the line want ("populated
// 0", "frozen 1"), at most d. The kernel signals every change of the file as a modify
// event (cgroup-v2.rst, "cgroup.events"): the wait is woken by it through inotify, and
// reads the file again at each one.
func waitEvents(path, want string, d time.Duration) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("watching %s: %v", path, err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_MODIFY); err != nil {
		return fmt.Errorf("watching %s: %v", path, err)
	}
	deadline := time.Now().Add(d)
	buf := make([]byte, 4096)
	for {
		// Read after the watch is set: a change between the two is not missed.
		if b, err := os.ReadFile(path); err == nil && hasLine(b, want) {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("%s did not reach %q", path, want)
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, int(left/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("watching %s: %v", path, err)
		}
		for {
			if n, err := unix.Read(fd, buf); n <= 0 || err != nil {
				break
			}
		}
	}
}

// hasLine reports whether data has the line want.
func hasLine(data []byte, want string) bool {
	for line := range bytes.Lines(data) {
		if string(bytes.TrimSpace(line)) == want {
			return true
		}
	}
	return false
}
