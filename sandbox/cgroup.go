package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Limits bound one space's instance and all its descendants. Zero fields are unlimited.
type Limits struct {
	// MemoryBytes caps resident memory (and swap, where the host accounts it); the
	// kernel OOM-kills inside the group when it is reached.
	MemoryBytes int64
	// CPU is a share of one core per scheduling period: 0.5 is half a core, 2 two cores.
	CPU float64
	// Pids caps the processes and threads of the instance.
	Pids int64
}

// The controllers the limits use.
const (
	ctrlMemory  = "memory"
	ctrlCPU     = "cpu"
	ctrlPids    = "pids"
	ctrlFreezer = "freezer"
)

// Cgroups is this box's view of the host's cgroup hierarchies: a unified (v2) tree where
// one is mounted and writable, and the v1 controllers mounted beside it (the hybrid
// layout), or v1 alone. Each box process keeps its spaces under one group of its own,
// lchat-<pid>, beside its own cgroup in every hierarchy it uses.
//
// Which hierarchy does what:
//   - Membership and "end them all": the v2 tree when there is one (clone3 puts the
//     instance straight into its group; cgroup.kill ends every descendant), else the v1
//     freezer (freeze, kill every member, thaw).
//   - A limit: the v2 controller when the v2 tree offers it (pure v2, e.g. systemd with
//     Delegate=yes), else the v1 controller of that name (hybrid and v1 hosts).
//
// A v1 group is joined by the thread that forks the instance (see Group.Start), so no
// instance code runs before it is inside every group.
type Cgroups struct {
	name string // lchat-<pid>

	// v2 is the absolute directory of this process's own v2 cgroup; "" without a usable
	// v2 tree. v2ctrl are the controllers enabled for the spaces' groups there.
	v2     string
	v2ctrl map[string]bool
	// v1 maps a v1 controller to the absolute directory of this process's own group in
	// that hierarchy (only controllers this package uses, and writable ones).
	v1 map[string]string
}

// OpenCgroups finds this process's cgroups and prepares a parent group for its spaces.
// It fails when no hierarchy can hold and end a space's processes (no writable v2 tree
// and no writable v1 freezer).
func OpenCgroups() (*Cgroups, error) {
	mounts, err := readMounts("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %v", err)
	}
	own, err := readOwnCgroups("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("reading /proc/self/cgroup: %v", err)
	}
	c := &Cgroups{name: "lchat-" + strconv.Itoa(os.Getpid()), v2ctrl: map[string]bool{}, v1: map[string]string{}}
	for _, m := range mounts {
		switch {
		case m.fstype == "cgroup2" && c.v2 == "":
			if p, ok := own[""]; ok {
				dir := join(m, p)
				if writable(dir) {
					c.v2 = dir
				}
			}
		case m.fstype == "cgroup":
			for _, ctrl := range []string{ctrlMemory, ctrlCPU, ctrlPids, ctrlFreezer} {
				if !slices.Contains(m.opts, ctrl) || c.v1[ctrl] != "" {
					continue
				}
				if p, ok := own[ctrl]; ok {
					dir := join(m, p)
					if writable(dir) {
						c.v1[ctrl] = dir
					}
				}
			}
		}
	}
	if c.v2 == "" && c.v1[ctrlFreezer] == "" {
		return nil, errors.New("no writable cgroup hierarchy: neither a cgroup v2 tree nor a v1 freezer this box may create groups in (under systemd: Delegate=yes)")
	}
	if c.v2 != "" {
		if err := checkClone3(); err != nil {
			return nil, err
		}
		c.enableV2Controllers()
	}
	c.sweep()
	for _, dir := range c.parents() {
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("creating cgroup %s: %v", dir, err)
		}
	}
	if c.v2 != "" && len(c.v2ctrl) > 0 {
		if err := writeFile(filepath.Join(c.v2, c.name, "cgroup.subtree_control"), c.v2Enable()); err != nil {
			c.v2ctrl = map[string]bool{}
		}
	}
	return c, nil
}

// enableV2Controllers turns on the memory, cpu and pids controllers for this process's
// own v2 group's children, which the spaces' parent group needs first. A group with
// controllers for its children may hold no process itself (except the root), so a box
// alone in its cgroup (a systemd service with Delegate=yes) moves itself into a leaf,
// box, first. Whatever cannot be enabled stays off; limits that need it are refused.
func (c *Cgroups) enableV2Controllers() {
	avail, err := os.ReadFile(filepath.Join(c.v2, "cgroup.controllers"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(avail)) {
		if f == ctrlMemory || f == ctrlCPU || f == ctrlPids {
			c.v2ctrl[f] = true
		}
	}
	if len(c.v2ctrl) == 0 {
		return
	}
	ctl := filepath.Join(c.v2, "cgroup.subtree_control")
	if writeFile(ctl, c.v2Enable()) == nil {
		return
	}
	leaf := filepath.Join(c.v2, "box")
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		c.v2ctrl = map[string]bool{}
		return
	}
	if writeFile(filepath.Join(leaf, "cgroup.procs"), "0") != nil || writeFile(ctl, c.v2Enable()) != nil {
		c.v2ctrl = map[string]bool{}
	}
}

func (c *Cgroups) v2Enable() string {
	var parts []string
	for _, ctrl := range []string{ctrlMemory, ctrlCPU, ctrlPids} {
		if c.v2ctrl[ctrl] {
			parts = append(parts, "+"+ctrl)
		}
	}
	return strings.Join(parts, " ")
}

// parents are the lchat-<pid> directories in every hierarchy used.
func (c *Cgroups) parents() []string {
	var out []string
	if c.v2 != "" {
		out = append(out, filepath.Join(c.v2, c.name))
	}
	for _, ctrl := range c.v1Used() {
		out = append(out, filepath.Join(c.v1[ctrl], c.name))
	}
	return out
}

// v1Used are the v1 controllers spaces join: the freezer when there is no v2 tree to
// end them with, and every limit controller the v2 tree does not offer.
func (c *Cgroups) v1Used() []string {
	var out []string
	for _, ctrl := range []string{ctrlMemory, ctrlCPU, ctrlPids, ctrlFreezer} {
		if c.v1[ctrl] == "" {
			continue
		}
		if ctrl == ctrlFreezer && c.v2 != "" || ctrl != ctrlFreezer && c.v2ctrl[ctrl] {
			continue
		}
		out = append(out, ctrl)
	}
	return out
}

// v1For are the v1 controllers a space with limits l joins: the freezer as v1Used says,
// and a limit controller only for a limit that is set. Joining a v1 hierarchy is a write
// of the forking thread into its tasks file, which waits out an RCU grace period (the
// kernel's cgroup_threadgroup_rwsem), several ms per hierarchy and wake; a controller
// with no limit to hold has nothing to enforce.
func (c *Cgroups) v1For(l Limits) []string {
	var out []string
	for _, ctrl := range c.v1Used() {
		switch {
		case ctrl == ctrlMemory && l.MemoryBytes <= 0, ctrl == ctrlCPU && l.CPU <= 0, ctrl == ctrlPids && l.Pids <= 0:
			continue
		}
		out = append(out, ctrl)
	}
	return out
}

// sweep ends the spaces of box processes that died without cleaning up (kill -9): their
// lchat-<pid> groups may still hold instances that double-forked away from the dead
// box's process group.
func (c *Cgroups) sweep() {
	var dirs []string
	if c.v2 != "" {
		dirs = append(dirs, c.v2)
	}
	for _, ctrl := range []string{ctrlMemory, ctrlCPU, ctrlPids, ctrlFreezer} {
		if c.v1[ctrl] != "" {
			dirs = append(dirs, c.v1[ctrl])
		}
	}
	for _, dir := range dirs {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			pid, ok := strings.CutPrefix(e.Name(), "lchat-")
			n, err := strconv.Atoi(pid)
			if !ok || err != nil || !e.IsDir() || n == os.Getpid() || processAlive(n) {
				continue
			}
			parent := filepath.Join(dir, e.Name())
			kids, _ := os.ReadDir(parent)
			for _, k := range kids {
				if k.IsDir() {
					g := &Group{c: c}
					if dir == c.v2 {
						g.v2 = filepath.Join(parent, k.Name())
					} else {
						g.v1 = []string{filepath.Join(parent, k.Name())}
					}
					g.Kill()
					g.Remove()
				}
			}
			os.Remove(parent)
		}
	}
}

// Describe says which hierarchy holds the spaces and which enforces each limit, for logs
// and the README's promise.
func (c *Cgroups) Describe() string {
	var b strings.Builder
	if c.v2 != "" {
		fmt.Fprintf(&b, "membership and kill: cgroup v2 %s", filepath.Join(c.v2, c.name))
	} else {
		fmt.Fprintf(&b, "membership and kill: cgroup v1 freezer %s", filepath.Join(c.v1[ctrlFreezer], c.name))
	}
	for _, ctrl := range []string{ctrlMemory, ctrlCPU, ctrlPids} {
		switch {
		case c.v2ctrl[ctrl]:
			fmt.Fprintf(&b, "; %s: v2", ctrl)
		case c.v1[ctrl] != "":
			fmt.Fprintf(&b, "; %s: v1", ctrl)
		default:
			fmt.Fprintf(&b, "; %s: unavailable", ctrl)
		}
	}
	return b.String()
}

// Check refuses limits this host cannot enforce, naming the controller.
func (c *Cgroups) Check(l Limits) error {
	var missing []string
	for ctrl, want := range map[string]bool{ctrlMemory: l.MemoryBytes > 0, ctrlCPU: l.CPU > 0, ctrlPids: l.Pids > 0} {
		if want && !c.v2ctrl[ctrl] && c.v1[ctrl] == "" {
			missing = append(missing, ctrl)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return fmt.Errorf("this host cannot enforce the %s limit: no %s controller this box may use in cgroup v2 (%s) or v1 (under systemd: Delegate=yes)",
		strings.Join(missing, " and "), strings.Join(missing, "/"), orNone(c.v2))
}

func orNone(s string) string {
	if s == "" {
		return "not mounted or not writable"
	}
	return s
}

// Close removes this process's parent groups if they are empty (best effort); a later
// Create makes them again.
func (c *Cgroups) Close() {
	for _, dir := range c.parents() {
		os.Remove(dir)
	}
}

// mount is one line of /proc/self/mountinfo, the fields this package needs.
type mount struct {
	root, point, fstype string
	opts                []string // super options: v1 controller names
}

func readMounts(path string) ([]mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent maj:min root point opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 5 || len(b) < 3 {
			continue
		}
		out = append(out, mount{root: unescape(a[3]), point: unescape(a[4]), fstype: b[0], opts: strings.Split(b[2], ",")})
	}
	return out, sc.Err()
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// readOwnCgroups maps each controller (v1) and "" (v2) to this process's cgroup path.
func readOwnCgroups(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for ctrl := range strings.SplitSeq(parts[1], ",") {
			out[ctrl] = parts[2]
		}
	}
	return out, nil
}

// join places a cgroup path under its mount (a container may see a mount whose root is
// its own group).
func join(m mount, p string) string {
	rel, err := filepath.Rel(m.root, p)
	if err != nil || strings.HasPrefix(rel, "..") {
		rel = p
	}
	return filepath.Join(m.point, rel)
}

func writable(dir string) bool {
	return dir != "" && unixAccessW(dir)
}

func writeFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
