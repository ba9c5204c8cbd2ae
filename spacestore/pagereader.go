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

// open starts a helper for one view of the database at abs: the view's Close ends the
// helper. The box's own lstat of the files (never followed through a link) is what the
// helper's answers are checked against.
func (r *PageReader) open(ctx context.Context, abs string, since *pageread.WALPos) (pageread.Source, error) {
	abs, files, err := r.files(abs)
	if err != nil {
		return nil, err
	}
	h, err := r.start()
	if err != nil {
		return nil, err
	}
	v, _, err := h.view(ctx, abs, since, files, false)
	if err != nil {
		return nil, err
	}
	return v, nil
}

// files is the box's own view of the database at abs (made absolute: the helper runs in /).
func (r *PageReader) files(abs string) (string, pageread.Files, error) {
	abs, err := filepath.Abs(abs)
	if err != nil {
		return "", pageread.Files{}, err
	}
	files, err := statDB(abs)
	return abs, files, err
}

// start starts a helper, whose life is its owner's to end (end): never the context of the
// request that started it, since a kept helper serves many.
func (r *PageReader) start() (*helperProc, error) {
	if _, err := os.Stat(r.Path); err != nil {
		return nil, fmt.Errorf("page reader %s: %w (build it beside lchat-caddy, docs/parsers.md)", r.Path, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
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
	h := &helperProc{cmd: cmd, stdin: stdin, stdout: stdout, cancel: cancel, release: release, timeout: r.timeout(), stderr: stderr,
		session: pageread.NewSession(stdout, stdin)}
	h.deadline = time.AfterFunc(h.timeout, func() {
		h.timedOut.Store(true)
		cancel() // CommandContext kills the helper; its pipe closes and the read fails
	})
	h.deadline.Stop()
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

// helperProc is one lchat-pageread process and the box's session with it, serving views
// in turn; its owner ends it (end).
type helperProc struct {
	session *pageread.Session
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
	ended    atomic.Bool
	err      error
}

// view asks the helper for a view of the database at abs, checked against files; the
// helper is killed if ctx ends before the view is closed. On an error the helper is ended;
// reported is true when the helper itself reported it (an error frame, or its deadline),
// false when the session broke (the helper died or was killed before it answered).
func (h *helperProc) view(ctx context.Context, abs string, since *pageread.WALPos, files pageread.Files, tail bool) (v *helperView, reported bool, err error) {
	stop := context.AfterFunc(ctx, h.cancel)
	h.deadline.Reset(h.timeout)
	open := h.session.Open
	if tail {
		open = h.session.OpenTail
	}
	c, err := open(abs, since, files)
	h.deadline.Stop()
	if err != nil {
		stop()
		var he *pageread.HelperError
		reported = errors.As(err, &he) || h.timedOut.Load() || ctx.Err() != nil
		return nil, reported, h.end(err)
	}
	return &helperView{Client: c, h: h, stop: stop}, false, nil
}

// forget asks the helper to close the connection it keeps for abs; an error ends it.
func (h *helperProc) forget(abs string) {
	h.deadline.Reset(h.timeout)
	err := h.session.Forget(abs)
	h.deadline.Stop()
	if err != nil {
		h.end(err)
	}
}

// end closes the helper's stdin (it closes its connections and exits), waits for it (it is
// killed at its deadline, or at once after a failure) and returns err explained: a helper
// killed at its deadline says so, and one that failed adds what it wrote on stderr.
func (h *helperProc) end(err error) error {
	h.once.Do(func() {
		h.ended.Store(true)
		if err != nil {
			h.cancel() // kills it: after a failure its answer is of no use
		} else {
			h.deadline.Reset(h.timeout) // closing its connections may checkpoint a WAL: bounded too
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

// helperView is one view a helper serves: each request runs under the helper's deadline,
// and an error ends the helper, reported with the process's fate.
type helperView struct {
	*pageread.Client
	h    *helperProc
	stop func() bool // of the AfterFunc that kills the helper with the view's context
	// kept is set for a helper kept between views (HelperViews): Close ends the view
	// only, and done, called with the view's fate (nil: it ended cleanly), hands the helper
	// back. Otherwise Close ends the helper.
	kept   bool
	done   func(error) error
	closed bool
}

// Close ends the view and, unless the helper is kept, the helper.
func (v *helperView) Close() error {
	if v.closed {
		return nil
	}
	v.closed = true
	v.stop()
	var err error
	switch {
	case v.h.ended.Load():
		err = v.h.end(nil) // ended by an error of the view: that error
	case v.kept:
		v.h.deadline.Reset(v.h.timeout)
		err = v.Client.Close()
		v.h.deadline.Stop()
		if err != nil {
			err = v.h.end(err)
		}
	default:
		err = v.h.end(nil)
	}
	if v.done != nil {
		return v.done(err)
	}
	return err
}

func (v *helperView) IndexAll() error {
	v.h.deadline.Reset(v.h.timeout)
	return v.wrap(v.Client.IndexAll())
}

func (v *helperView) ChangedSinceTail() ([]uint32, error) {
	v.h.deadline.Reset(v.h.timeout)
	p, err := v.Client.ChangedSinceTail()
	return p, v.wrap(err)
}

func (v *helperView) ReadPages(pgnos []uint32, fn func(uint32, []byte) error) error {
	v.h.deadline.Reset(v.h.timeout)
	return v.wrap(v.Client.ReadPages(pgnos, fn))
}

func (v *helperView) Scan(fn func(uint32, []byte) error) error {
	v.h.deadline.Reset(v.h.timeout)
	return v.wrap(v.Client.Scan(fn))
}

func (v *helperView) wrap(err error) error {
	v.h.deadline.Stop()
	if err == nil {
		return nil
	}
	return v.h.end(err)
}

// HelperViews keeps one lchat-pageread process of a space between views, and in it one
// SQLite connection per database (pageread.Keeper): a view then costs two round trips on
// a pipe and a BEGIN IMMEDIATE, where a helper per view costs an exec, the Go runtime's
// start and opening SQLite. The process is confined as every helper is (PageReader: the
// space's uid, an empty environment, the answer deadline, the memory bound, Pdeathsig),
// and the box checks every frame it sends. A helper that died or failed is replaced at the
// next open; a helper whose every database was forgotten ends. The owner closes it (Close)
// when the space stops. Safe for concurrent use: a second view while one is open gets a
// helper of its own, ended at its Close.
type HelperViews struct {
	r *PageReader

	mu     sync.Mutex
	h      *helperProc     // the kept helper, nil when none runs
	busy   bool            // a view of h is open
	paths  map[string]bool // the databases h keeps a connection for
	closed bool
}

// NewHelperViews keeps views of databases read through r.
func NewHelperViews(r *PageReader) *HelperViews {
	return &HelperViews{r: r, paths: make(map[string]bool)}
}

// Open opens a view of the database at abs (since as in pageread.Keeper.OpenTail: a log
// segment's) in the kept helper, started if none runs or it died.
func (k *HelperViews) Open(ctx context.Context, abs string, since *pageread.WALPos) (pageread.Source, error) {
	abs, files, err := k.r.files(abs)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	if k.closed || k.busy {
		k.mu.Unlock()
		return k.r.open(ctx, abs, since)
	}
	k.busy = true
	h := k.h
	k.mu.Unlock()
	if h != nil && h.ended.Load() {
		h = nil
	}
	var v *helperView
	if h != nil {
		var reported bool
		v, reported, err = h.view(ctx, abs, since, files, true)
		if err != nil && !reported {
			h = nil // it died between views: once more, on a new one
		} else if err != nil {
			k.drop()
			return nil, err
		}
	}
	if h == nil {
		if h, err = k.r.start(); err == nil {
			v, _, err = h.view(ctx, abs, since, files, true)
		}
		if err != nil {
			k.drop()
			return nil, err
		}
	}
	k.mu.Lock()
	k.h = h
	k.paths[abs] = true
	k.mu.Unlock()
	v.kept = true
	v.done = func(err error) error {
		k.mu.Lock()
		k.busy = false
		end := k.closed || err != nil
		if end && k.h == h {
			k.h = nil
			clear(k.paths)
		}
		k.mu.Unlock()
		if end {
			return h.end(err)
		}
		return nil
	}
	return v, nil
}

// drop forgets the kept helper after a failed open (it has ended).
func (k *HelperViews) drop() {
	k.mu.Lock()
	k.busy = false
	k.h = nil
	clear(k.paths)
	k.mu.Unlock()
}

// Forget closes the helper's connection to the database at abs (the database is gone, or
// idle); the helper ends when it keeps none.
func (k *HelperViews) Forget(abs string) {
	if a, err := filepath.Abs(abs); err == nil {
		abs = a
	}
	k.mu.Lock()
	h := k.h
	if h == nil || k.busy || !k.paths[abs] {
		k.mu.Unlock()
		return
	}
	delete(k.paths, abs)
	if len(k.paths) == 0 {
		k.h = nil
		k.mu.Unlock()
		h.end(nil) // it closes its connections as it exits
		return
	}
	k.busy = true // the session is the forget's until it is answered
	k.mu.Unlock()
	h.forget(abs)
	k.mu.Lock()
	k.busy = false
	if h.ended.Load() && k.h == h {
		k.h = nil
		clear(k.paths)
	}
	if k.closed && k.h == h {
		k.h = nil
		k.mu.Unlock()
		h.end(nil)
		return
	}
	k.mu.Unlock()
}

// Close ends the kept helper (at the end of its open view, if one is); views opened after
// it get a helper each. It is idempotent.
func (k *HelperViews) Close() error {
	k.mu.Lock()
	k.closed = true
	h := k.h
	if k.busy {
		h = nil // the view's Close ends it
	} else {
		k.h = nil
		clear(k.paths)
	}
	k.mu.Unlock()
	if h != nil {
		return h.end(nil)
	}
	return nil
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
var _ pageread.Source = (*helperView)(nil)
