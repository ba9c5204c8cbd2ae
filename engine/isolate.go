package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/sandbox"
)

// Isolation is how a kind's instances are kept apart from the box and from each other
// (Kind.Isolation).
type Isolation string

// Isolation modes of a kind.
const (
	// IsolationAuto (the default, "") isolates where this box can: it holds the
	// capabilities, has a writable cgroup hierarchy, and its state dir is reachable by
	// other uids. Otherwise the kind runs as the box's own user (logged at start).
	IsolationAuto Isolation = ""
	// IsolationOn isolates or refuses the kind, naming what is missing.
	IsolationOn Isolation = "on"
	// IsolationNone runs the instance as the box's own user, in a process group: the
	// explicit opt-out (a development box that is not root).
	IsolationNone Isolation = "none"
)

// Limits bound one space's instance and all its descendants; zero fields are unlimited.
// Any limit needs a cgroup hierarchy that enforces it; a kind asking for one this host
// cannot enforce is refused.
type Limits struct {
	// MemoryBytes caps resident memory (swap included where the host accounts it). The
	// kernel OOM-kills the instance at the limit; the engine reports a crash.
	MemoryBytes int64
	// CPU is a share of one core: 0.5 is half a core, 2 is two cores.
	CPU float64
	// Pids caps the instance's processes and threads.
	Pids int64
	// DiskBytes caps the space's data dir and its /tmp together: they live in a
	// filesystem image of this size, mounted while the space is on this box (disk.go).
	// A write past it fails with ENOSPC inside the instance. At least
	// sandbox.MinDiskBytes; needs isolation and a private /tmp.
	DiskBytes int64
}

// any reports a limit that needs a cgroup (DiskBytes needs none).
func (l Limits) any() bool { return l.MemoryBytes > 0 || l.CPU > 0 || l.Pids > 0 }

func (l Limits) sandbox() sandbox.Limits {
	return sandbox.Limits{MemoryBytes: l.MemoryBytes, CPU: l.CPU, Pids: l.Pids}
}

// hostCgroups is this process's cgroup view, opened once: it creates this process's
// parent group and sweeps the groups of dead boxes.
var hostCgroups = sync.OnceValues(func() (*sandbox.Cgroups, error) {
	cgroupsOpened.Store(true)
	return sandbox.OpenCgroups()
})

// cgroupsOpened is set once hostCgroups ran, so Close tidies only what was made.
var cgroupsOpened atomic.Bool

// checkIsolation refuses a kind this host cannot run as configured.
func checkIsolation(k Kind) error {
	switch k.Isolation {
	case IsolationAuto, IsolationNone:
	case IsolationOn:
		if err := sandbox.CheckIsolationCaps(); err != nil {
			return err
		}
		if _, err := hostCgroups(); err != nil {
			return fmt.Errorf("isolation needs cgroups: %v", err)
		}
	default:
		return fmt.Errorf("unknown isolation %q: on or none", k.Isolation)
	}
	if k.Limits.MemoryBytes < 0 || k.Limits.CPU < 0 || k.Limits.Pids < 0 {
		return errors.New("limits must not be negative")
	}
	if err := checkDisk(k); err != nil {
		return err
	}
	if k.Limits.any() {
		cg, err := hostCgroups()
		if err != nil {
			return fmt.Errorf("limits need cgroups: %v", err)
		}
		if err := cg.Check(k.Limits.sandbox()); err != nil {
			return err
		}
	}
	return checkNetwork(k)
}

// isolated reports whether spaces of k run under their own uid on this box.
func (e *Engine) isolated(k Kind) bool {
	switch k.Isolation {
	case IsolationOn:
		return true
	case IsolationNone:
		return false
	}
	return e.whyNotIsolated(k) == nil
}

// whyNotIsolated says why spaces of k would not run under their own uid on this box
// (nil when they can): the opt-out, or the first of the checks an unset isolation makes.
func (e *Engine) whyNotIsolated(k Kind) error {
	if k.Isolation == IsolationNone {
		return errors.New("isolation none")
	}
	if err := sandbox.CheckIsolationCaps(); err != nil {
		return err
	}
	if _, err := hostCgroups(); err != nil {
		return err
	}
	if err := e.stateDirReachable(); err != nil {
		return err
	}
	if err := e.pageReaderPresent(); err != nil {
		return err
	}
	return commandReachable(k.Command)
}

// WhyNotIsolated says why spaces of the named kind do not run under their own uid on
// this box, nil when they do: the reason the start-up log gives as why_not.
func (e *Engine) WhyNotIsolated(kind string) error {
	k, ok := e.Kinds()[kind]
	if !ok {
		return fmt.Errorf("no kind %q", kind)
	}
	if e.isolated(k) {
		return nil
	}
	return e.whyNotIsolated(k)
}

// commandReachable checks that a space's uid could execute command: the file and every
// directory above it must be open to others (o+x).
func commandReachable(command string) error {
	p, err := exec.LookPath(command)
	if err != nil {
		return err
	}
	p, err = filepath.Abs(p)
	if err != nil {
		return err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o001 == 0 {
		return fmt.Errorf("command %s is not executable by the spaces' uids (mode %v)", p, fi.Mode().Perm())
	}
	return searchableAbove(p)
}

// searchableAbove checks that every directory above path is searchable by others.
func searchableAbove(path string) error {
	for d := filepath.Dir(path); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is not searchable by the spaces' uids (mode %v): isolation needs o+x on it", d, fi.Mode().Perm())
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// stateDirReachable checks that a space's uid can reach its data dir and socket: every
// directory above the state dir must be searchable by others (o+x). The state dir and
// the directories the engine makes below it are 0711: searchable, not listable.
func (e *Engine) stateDirReachable() error {
	return searchableAbove(e.cfg.StateDir)
}

// checkKindsHere adds the checks that need this engine (its state dir, its egress
// filter) to checkIsolation. A kind asking for network none or egress is refused when
// this box cannot isolate it or cannot install the filter.
func (e *Engine) checkKindsHere(kinds map[string]Kind) error {
	e.retryFirewall()
	for name, k := range kinds {
		if k.Isolation == IsolationOn {
			if err := e.stateDirReachable(); err != nil {
				return fmt.Errorf("engine: kind %s: %v", name, err)
			}
			if err := commandReachable(k.Command); err != nil {
				return fmt.Errorf("engine: kind %s: %v", name, err)
			}
			if err := e.pageReaderPresent(); err != nil {
				return fmt.Errorf("engine: kind %s: %v", name, err)
			}
		}
		iso := e.isolated(k)
		if _, _, err := e.network(k, iso); err != nil {
			return fmt.Errorf("engine: kind %s: %v", name, err)
		}
		if err := e.checkDiskHere(k, iso); err != nil {
			return fmt.Errorf("engine: kind %s: %v", name, err)
		}
		if err := e.checkActivation(k); err != nil {
			return fmt.Errorf("engine: kind %s: %v", name, err)
		}
	}
	return nil
}

// logIsolation says once per kind set how each kind runs, where the cgroups are, and
// what its instances reach over the network (and why not egress, when it was not set).
func (e *Engine) logIsolation(kinds map[string]Kind) {
	for name, k := range kinds {
		iso := e.isolated(k)
		f := []zap.Field{zap.String("kind", name), zap.Bool("isolated", iso)}
		if !iso && k.Isolation == IsolationAuto {
			f = append(f, zap.NamedError("why_not", e.whyNotIsolated(k)))
		}
		if cg, err := hostCgroups(); err == nil && (iso || k.Limits.any()) {
			f = append(f, zap.String("cgroups", cg.Describe()))
		}
		mode, whyNot, _ := e.network(k, iso)
		f = append(f, zap.String("network", string(mode)))
		if whyNot != nil {
			f = append(f, zap.NamedError("network_why_not_egress", whyNot))
		}
		if len(k.NetworkAllow) > 0 {
			f = append(f, zap.Stringers("network_allow", k.NetworkAllow))
		}
		private, whyNotTmp := e.privateTmp(k, iso)
		f = append(f, zap.Bool("private_tmp", private))
		if whyNotTmp != nil {
			f = append(f, zap.NamedError("tmp_why_not_private", whyNotTmp))
		}
		if k.Limits.DiskBytes > 0 {
			f = append(f, zap.Int64("disk_bytes", k.Limits.DiskBytes))
		}
		e.log.Info("kind isolation", f...)
	}
}

// uidRange is the range the spaces' uids come from, defaults applied.
func (e *Engine) uidRange() (first, count uint32) {
	first, count = e.cfg.UIDFirst, e.cfg.UIDCount
	if first == 0 {
		first = sandbox.DefaultUIDFirst
	}
	if count == 0 {
		count = sandbox.DefaultUIDCount
	}
	return first, count
}

// uidAlloc returns the uid allocator, opened on first use.
func (e *Engine) uidAlloc() (*sandbox.UIDs, error) {
	e.uidMu.Lock()
	defer e.uidMu.Unlock()
	if e.uids != nil {
		return e.uids, nil
	}
	first, count := e.uidRange()
	u, err := sandbox.OpenUIDs(filepath.Join(e.cfg.StateDir, "uids.json"), first, count)
	if err != nil {
		return nil, err
	}
	e.uids = u
	return u, nil
}

// sandboxPlan is how one start of an instance is confined.
type sandboxPlan struct {
	cred  *syscall.Credential // nil: the box's own user
	group *sandbox.Group      // nil: a process group only
	// emptyNet starts the instance in a network namespace of its own (network none).
	emptyNet bool
	// netRelease ends the start's admission to the egress filter; nil: none.
	netRelease func()
	// tmpDir is the instance's own /tmp (sandbox.StartOptions.TmpDir); "": the box's.
	tmpDir string
}

// release undoes what the plan readied, for a start that failed.
func (p sandboxPlan) release() {
	if p.group != nil {
		p.group.Remove()
	}
	if p.netRelease != nil {
		p.netRelease()
	}
}

// prepareSandbox readies the directories, the cgroup and the network of a start: with
// isolation the data dir and the socket dir are handed to the space's uid (0700) while
// everything else under the state dir stays the box's, searchable but not listable
// (0711) or private, and the uid is admitted to the egress filter as its kind's network
// says (or the start is marked for an empty network namespace).
func (e *Engine) prepareSandbox(in *inst, k Kind) (sandboxPlan, error) {
	var plan sandboxPlan
	iso := e.isolated(k)
	sockDir := filepath.Dir(in.socket)
	if err := os.MkdirAll(sockDir, 0o700); err != nil {
		return plan, err
	}
	if iso {
		alloc, err := e.uidAlloc()
		if err != nil {
			return plan, err
		}
		uid, err := alloc.For(in.host)
		if err != nil {
			return plan, err
		}
		for _, d := range []string{e.cfg.StateDir, filepath.Dir(in.dir), in.dir, filepath.Dir(sockDir)} {
			if err := os.Chmod(d, 0o711); err != nil {
				return plan, err
			}
		}
		if err := os.MkdirAll(in.dataDir, 0o700); err != nil {
			return plan, err
		}
		for _, d := range []string{in.dataDir, sockDir} {
			if err := os.Chmod(d, 0o700); err != nil {
				return plan, err
			}
		}
		if err := chownTree(in.dataDir, int(uid)); err != nil {
			return plan, fmt.Errorf("handing the data dir to uid %d: %v", uid, err)
		}
		if err := os.Lchown(sockDir, int(uid), int(uid)); err != nil {
			return plan, fmt.Errorf("handing the socket dir to uid %d: %v", uid, err)
		}
		plan.cred = &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}
		if private, _ := e.privateTmp(k, true); private {
			// In the space's disk when it has one (mounted by the wake, before its
			// restore), else beside its data dir; never the box's /tmp.
			plan.tmpDir = filepath.Join(in.dir, "tmp")
			if d := e.mountedDisk(in.host); d != nil {
				plan.tmpDir = d.TmpDir()
			}
			if err := sandbox.PrepareTmpDir(plan.tmpDir, uid, uid); err != nil {
				return plan, fmt.Errorf("preparing the space's /tmp: %v", err)
			}
		}
	}
	if iso || k.Limits.any() {
		cg, err := hostCgroups()
		if err != nil {
			return plan, err
		}
		g, err := cg.Create(in.host, k.Limits.sandbox())
		if err != nil {
			return plan, err
		}
		plan.group = g
	}
	if iso {
		mode, _, err := e.network(k, true)
		if err == nil {
			plan.emptyNet = mode == NetworkNone
			plan.netRelease, err = e.admitNetwork(k, mode, plan.cred.Uid)
		}
		if err != nil {
			plan.release()
			return sandboxPlan{}, err
		}
	}
	return plan, nil
}

// chownTree hands every file under root to uid (gid the same), never following a link.
func chownTree(root string, uid int) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
}
