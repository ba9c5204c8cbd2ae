package spacestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lchat/lchat-caddy/spacestore/pageread"
)

// PageReaderName is the helper's file name: the box looks for it beside its own executable.
const PageReaderName = "lchat-pageread"

// Defaults of a PageReader.
const (
	// DefaultPageReadTimeout bounds each answer of the helper: opening the database, a
	// scan of every page, one batch of pages. The uploads the checkpoint makes between
	// requests do not count, so a slow bucket never kills a helper.
	DefaultPageReadTimeout = 2 * time.Minute
	// DefaultPageReadMemory is the helper's address-space limit (RLIMIT_AS). The helper
	// holds one page at a time besides the WAL's frame index (its resident size reading a
	// 50 MB database is about 10 MB), but the Go runtime and the SQLite driver reserve
	// about 1.5 GiB of address space they never touch, which RLIMIT_AS counts: 1 GiB fails
	// at the first mmap of the -shm file.
	DefaultPageReadMemory = 3 << 30
)

// PageReader reads a space's SQLite databases in a helper process, lchat-pageread, running
// under the space's uid with no supplementary groups and no capabilities, killed when an
// answer takes longer than Timeout, its address space bounded by MaxMemory, and killed
// with the box (Pdeathsig). A
// crafted database then attacks that process, with the space's own privileges, never the
// box; the box checks every frame it sends (pageread.Client). docs/parsers.md.
type PageReader struct {
	// Path is the lchat-pageread binary; it must be executable by the space's uid.
	Path string
	// UID and GID are the space's.
	UID, GID uint32
	// Timeout bounds each answer of the helper; default DefaultPageReadTimeout.
	Timeout time.Duration
	// MaxMemory is the helper's RLIMIT_AS in bytes; default DefaultPageReadMemory.
	MaxMemory int64
	// Start starts the prepared command; nil means cmd.Start. The engine passes
	// sandbox.StartHelper, which first empties the forking thread's ambient and
	// inheritable capabilities; release is called once the helper is reaped.
	Start func(cmd *exec.Cmd) (release func(), err error)
}

func (r *PageReader) timeout() time.Duration {
	if r.Timeout > 0 {
		return r.Timeout
	}
	return DefaultPageReadTimeout
}

func (r *PageReader) maxMemory() int64 {
	if r.MaxMemory > 0 {
		return r.MaxMemory
	}
	return DefaultPageReadMemory
}

// openPages opens one consistent view of the database at abs: in this process when the
// Syncer has no PageReader (the space runs as the box's own user), else through the helper.
func (s *Syncer) openPages(ctx context.Context, abs string, since *pageread.WALPos) (pageread.Source, error) {
	if s.PageReader == nil {
		return pageread.Open(ctx, abs, since)
	}
	return s.PageReader.open(ctx, abs, since)
}

// open starts the helper for the database at abs and dials it. The box's own lstat of the
// files (never followed through a link) is what the helper's answers are checked against.
func (r *PageReader) open(ctx context.Context, abs string, since *pageread.WALPos) (pageread.Source, error) {
	abs, err := filepath.Abs(abs) // the helper runs in /
	if err != nil {
		return nil, err
	}
	files, err := statDB(abs)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(r.Path); err != nil {
		return nil, fmt.Errorf("page reader %s: %w (build it beside lchat-caddy, docs/parsers.md)", r.Path, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, r.Path, "-max-memory", strconv.FormatInt(r.maxMemory(), 10))
	cmd.Env = []string{} // the box's environment holds credentials; the space's uid could read the helper's
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: r.UID, Gid: r.GID, Groups: []uint32{}},
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
	}
	cmd.WaitDelay = time.Second
	stderr := &capped{max: 4096}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	// The pages come back on a pipe of our own, widened: at the default 64 KiB a 50 MB scan
	// costs the box and the helper hundreds of wake-ups each.
	stdout, w, err := os.Pipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if rc, err := stdout.SyscallConn(); err == nil { // not Fd(): that would make reads blocking
		rc.Control(func(fd uintptr) {
			unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 1<<20) // best effort: fs.pipe-max-size may be lower
		})
	}
	cmd.Stdout = w
	release := func() {}
	if r.Start != nil {
		release, err = r.Start(cmd)
	} else {
		err = cmd.Start()
	}
	w.Close() // the helper has its own
	if err != nil {
		stdout.Close()
		cancel()
		return nil, fmt.Errorf("starting page reader %s: %w", r.Path, err)
	}
	h := &helperSession{cmd: cmd, stdin: stdin, stdout: stdout, cancel: cancel, release: release, timeout: r.timeout(), stderr: stderr}
	h.deadline = time.AfterFunc(h.timeout, func() {
		h.timedOut.Store(true)
		cancel() // CommandContext kills the helper; its pipe closes and the read fails
	})
	c, err := pageread.Dial(stdout, stdin, abs, since, files)
	h.deadline.Stop()
	if err != nil {
		return nil, h.end(err)
	}
	h.Client = c
	return h, nil
}

// statDB is the box's own view of a database's files: the main file must be a regular file
// (not a link), the WAL a regular file or absent.
func statDB(abs string) (pageread.Files, error) {
	var f pageread.Files
	fi, err := os.Lstat(abs)
	if err != nil {
		return f, err
	}
	if !fi.Mode().IsRegular() {
		return f, fmt.Errorf("%s is not a regular file (%v)", filepath.Base(abs), fi.Mode().Type())
	}
	f.Dev, f.Ino = statID(fi)
	f.MainSize = fi.Size()
	switch wi, err := os.Lstat(abs + "-wal"); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return f, err
	case !wi.Mode().IsRegular():
		return f, fmt.Errorf("%s-wal is not a regular file (%v)", filepath.Base(abs), wi.Mode().Type())
	default:
		f.WALSize = wi.Size()
	}
	return f, nil
}

// helperSession is a Client whose Close also ends the helper's process.
type helperSession struct {
	*pageread.Client
	cmd     *exec.Cmd
	stdin   interface{ Close() error }
	stdout  *os.File
	cancel  context.CancelFunc
	release func()
	timeout time.Duration
	// deadline kills the helper when an answer takes longer than timeout: armed for each
	// request, stopped once it is answered.
	deadline *time.Timer
	timedOut atomic.Bool
	stderr   *capped
	once     sync.Once
	err      error
}

// end closes the helper's stdin (it exits at the end of its requests), waits for it (it is
// killed at its deadline, or at once after a failure) and returns err explained: a helper
// killed at its deadline says so, and one that failed adds what it wrote on stderr.
func (h *helperSession) end(err error) error {
	h.once.Do(func() {
		if err != nil {
			h.cancel() // kills it: after a failure its answer is of no use
		}
		h.stdin.Close()
		werr := h.cmd.Wait()
		h.stdout.Close()
		h.release()
		h.deadline.Stop()
		h.cancel()
		switch {
		case h.timedOut.Load():
			h.err = fmt.Errorf("page reader killed at its deadline (%v for an answer)", h.timeout)
		case err != nil:
			var he *pageread.HelperError
			if errors.As(err, &he) || werr == nil {
				h.err = fmt.Errorf("page reader: %w", err)
			} else {
				h.err = fmt.Errorf("page reader: %w (%v%s)", err, werr, h.stderr.note())
			}
		case werr != nil:
			h.err = fmt.Errorf("page reader: %v%s", werr, h.stderr.note())
		}
	})
	return h.err
}

// Close ends the session and the helper.
func (h *helperSession) Close() error {
	h.Client.Close()
	return h.end(nil)
}

// Each request runs under the deadline, and its error is reported with the process's
// fate.
func (h *helperSession) IndexAll() error {
	h.deadline.Reset(h.timeout)
	return h.wrap(h.Client.IndexAll())
}

func (h *helperSession) ChangedSinceTail() ([]uint32, error) {
	h.deadline.Reset(h.timeout)
	p, err := h.Client.ChangedSinceTail()
	return p, h.wrap(err)
}

func (h *helperSession) ReadPages(pgnos []uint32, fn func(uint32, []byte) error) error {
	h.deadline.Reset(h.timeout)
	return h.wrap(h.Client.ReadPages(pgnos, fn))
}

func (h *helperSession) Scan(fn func(uint32, []byte) error) error {
	h.deadline.Reset(h.timeout)
	return h.wrap(h.Client.Scan(fn))
}

func (h *helperSession) wrap(err error) error {
	h.deadline.Stop()
	if err == nil {
		return nil
	}
	return h.end(err)
}

// capped keeps the first max bytes written to it (the helper's stderr).
type capped struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capped) note() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, _, _ := strings.Cut(string(bytes.TrimSpace(c.buf.Bytes())), "\n")
	if s == "" {
		return ""
	}
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return ": " + strconv.Quote(s)
}

// Interface guards
var _ pageread.Source = (*helperSession)(nil)
