package engine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/sandbox"
)

// Tmp is what a kind's instances see on /tmp and /var/tmp (Kind.Tmp).
type Tmp string

// Tmp modes of a kind.
const (
	// TmpAuto (the default, "") is TmpPrivate for a kind isolated on this box when the
	// box can give it (CAP_SYS_ADMIN, mount namespaces allowed), else TmpHost (logged).
	TmpAuto Tmp = ""
	// TmpPrivate gives each start of an instance its own mount namespace with the
	// space's own tmp directory on /tmp and /var/tmp: inside its disk with limits.disk,
	// else <state_dir>/spaces/<host>/tmp (0700, the space's). It is emptied at each start.
	TmpPrivate Tmp = "private"
	// TmpHost leaves the box's /tmp to the instance: the explicit opt-out.
	TmpHost Tmp = "host"
)

// privateTmpWorks probes once per process whether the box can give instances a /tmp of
// their own (sandbox.CheckPrivateTmp).
var privateTmpWorks = sync.OnceValue(sandbox.CheckPrivateTmp)

// checkDisk refuses a disk or tmp setting that cannot work on this host whatever the
// engine: a size ext4 cannot hold, a disk without the space's own uid or with the box's
// /tmp (outside the limit), what the box lacks for loop images or a private /tmp.
func checkDisk(k Kind) error {
	switch k.Tmp {
	case TmpAuto, TmpHost:
	case TmpPrivate:
		if k.Isolation == IsolationNone {
			return errors.New("tmp private needs the space's own uid: set isolation on, or tmp host")
		}
		if err := privateTmpWorks(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown tmp %q: private or host", k.Tmp)
	}
	d := k.Limits.DiskBytes
	switch {
	case d == 0:
		return nil
	case d < 0:
		return errors.New("limits.disk: must be positive")
	case d < sandbox.MinDiskBytes:
		return fmt.Errorf("limits.disk: %d bytes is below the smallest disk, %d (16MiB): ext4's own metadata would leave no room", d, sandbox.MinDiskBytes)
	case k.Isolation == IsolationNone:
		return errors.New("limits.disk needs the space's own uid: set isolation on")
	case k.Tmp == TmpHost:
		return errors.New("limits.disk holds the space's /tmp too: tmp host would leave /tmp outside it")
	}
	if err := sandbox.CheckDisks(); err != nil {
		return err
	}
	if err := privateTmpWorks(); err != nil {
		return fmt.Errorf("limits.disk holds the space's /tmp too: %v", err)
	}
	return nil
}

// privateTmp reports whether instances of k get a /tmp of their own on this box, given
// whether k is isolated here; whyNot says why an unset tmp is the box's. A kind that asks
// for a private /tmp (or a disk) on a box that cannot give it is refused before this
// (checkDiskHere).
func (e *Engine) privateTmp(k Kind, iso bool) (private bool, whyNot error) {
	switch {
	case k.Tmp == TmpHost:
		return false, nil
	case k.Tmp == TmpPrivate || k.Limits.DiskBytes > 0:
		return iso, nil
	case !iso:
		return false, fmt.Errorf("the kind is not isolated: %v", e.whyNotIsolated(k))
	}
	if err := privateTmpWorks(); err != nil {
		return false, err
	}
	if err := e.hiddenByPrivateTmp(k); err != nil {
		return false, err
	}
	return true, nil
}

// hiddenByPrivateTmp says what an instance of k needs that a private /tmp would hide:
// the state dir (its data dir and socket) or its command under /tmp or /var/tmp. The
// answer is kept per command (the state dir is the engine's), since every start asks.
func (e *Engine) hiddenByPrivateTmp(k Kind) error {
	if v, ok := e.tmpHidden.Load(k.Command); ok {
		err, _ := v.(error)
		return err
	}
	err := e.findHiddenByPrivateTmp(k)
	e.tmpHidden.Store(k.Command, err)
	return err
}

func (e *Engine) findHiddenByPrivateTmp(k Kind) error {
	cmd, err := exec.LookPath(k.Command)
	if err == nil {
		cmd, err = filepath.Abs(cmd)
	}
	for what, p := range map[string]string{"the state dir": e.cfg.StateDir, "the command": cmd} {
		if p == "" {
			continue
		}
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		for _, t := range []string{"/tmp", "/var/tmp"} {
			if rt, err := filepath.EvalSymlinks(t); err == nil {
				t = rt
			}
			if p == t || strings.HasPrefix(p, t+"/") {
				return fmt.Errorf("%s %s is under %s, which a private /tmp hides from the instance", what, p, t)
			}
		}
	}
	return nil
}

// checkDiskHere refuses a kind whose disk or private /tmp this engine cannot give: it
// needs the kind isolated here, and its state dir and command outside /tmp.
func (e *Engine) checkDiskHere(k Kind, iso bool) error {
	want := ""
	switch {
	case k.Limits.DiskBytes > 0:
		want = "limits.disk"
	case k.Tmp == TmpPrivate:
		want = "tmp private"
	default:
		return nil
	}
	if !iso {
		return fmt.Errorf("%s needs the space's own uid, and this box cannot isolate the kind: %v", want, e.whyNotIsolated(k))
	}
	if err := e.hiddenByPrivateTmp(k); err != nil {
		return fmt.Errorf("%s needs a private /tmp: %v", want, err)
	}
	return nil
}

// openDisks returns this engine's disk images, opened (and a dead box's tidied) on
// first use.
func (e *Engine) openDisks() (*sandbox.Disks, error) {
	e.diskMu.Lock()
	defer e.diskMu.Unlock()
	if e.disks != nil {
		return e.disks, nil
	}
	d, err := sandbox.OpenDisks(e.disksDir())
	if err != nil {
		return nil, err
	}
	e.disks = d
	return d, nil
}

func (e *Engine) disksDir() string { return filepath.Join(e.cfg.StateDir, "disks") }

// tidyDisks opens the disks at start-up when an earlier box on this state dir made any,
// so that what a box that died left mounted is unmounted now, not at the next wake of a
// kind with a disk.
func (e *Engine) tidyDisks() {
	if _, err := os.Stat(e.disksDir()); err != nil {
		return
	}
	if _, err := e.openDisks(); err != nil {
		e.log.Error("opening the spaces' disks", zap.Error(err))
	}
}

// attachDisk (in.op held) makes sure the space's disk is mounted, with its data/ on the
// data dir, before a wake restores into it. Only the first wake on this box pays: later
// ones find it mounted. nil without limits.disk.
func (e *Engine) attachDisk(in *inst, k Kind) (*sandbox.Disk, error) {
	if k.Limits.DiskBytes == 0 {
		return nil, nil
	}
	if d := e.mountedDisk(in.host); d != nil {
		return d, nil
	}
	disks, err := e.openDisks()
	if err != nil {
		return nil, err
	}
	alloc, err := e.uidAlloc()
	if err != nil {
		return nil, err
	}
	uid, err := alloc.For(in.host)
	if err != nil {
		return nil, err
	}
	d, err := disks.Attach(sandbox.DiskSpec{Name: in.host, Bytes: k.Limits.DiskBytes, UID: uid, GID: uid,
		Mount: filepath.Join(in.dir, "disk"), Bind: in.dataDir})
	if err != nil {
		return nil, fmt.Errorf("attaching the space's disk: %v", err)
	}
	if d.Bytes != k.Limits.DiskBytes {
		in.logger().Warn("the space's disk keeps the size it was made with until the space leaves this box",
			zap.Int64("disk_bytes", d.Bytes), zap.Int64("limit", k.Limits.DiskBytes))
	}
	return d, nil
}

// mountedDisk is the space's disk if it is mounted here.
func (e *Engine) mountedDisk(host string) *sandbox.Disk {
	e.diskMu.Lock()
	d := e.disks
	e.diskMu.Unlock()
	if d == nil {
		return nil
	}
	return d.Mounted(host)
}

// removeDisk (in.op held, the space not running) unmounts and deletes the space's disk:
// it leaves this box.
func (e *Engine) removeDisk(in *inst) error {
	e.diskMu.Lock()
	d := e.disks
	e.diskMu.Unlock()
	if d == nil {
		// A space that has not woken since the box started may still have an image.
		if _, err := os.Stat(filepath.Join(e.disksDir(), in.host+".img")); err != nil {
			return nil
		}
		var err error
		if d, err = e.openDisks(); err != nil {
			return fmt.Errorf("removing the space's disk: %v", err)
		}
	}
	if err := d.Remove(in.host); err != nil {
		return fmt.Errorf("removing the space's disk: %v", err)
	}
	return nil
}

// closeDisks unmounts every disk but those of instances that still run (a drain that ran
// out of time), keeping the images: the next box mounts them again, or tidies them.
func (e *Engine) closeDisks() {
	e.diskMu.Lock()
	d := e.disks
	e.disks = nil
	e.diskMu.Unlock()
	if d == nil {
		return
	}
	var keep []string
	for _, in := range e.all() {
		in.mu.Lock()
		p := in.proc
		in.mu.Unlock()
		if p != nil && !p.done() {
			keep = append(keep, in.host)
			e.log.Warn("keeping a disk mounted: its instance still runs", zap.String("host", in.host))
		}
	}
	if err := d.Close(keep...); err != nil {
		e.log.Error("unmounting the spaces' disks", zap.Error(err))
	}
}
