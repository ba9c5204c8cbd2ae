// Package pageread reads a SQLite database's pages the way SQLite's own readers do: from
// the newest committed WAL frame, else the main file, under the database's write lock (a
// tail of committed frames, which its checksums vouch for, without it: follow.go). It is
// the one implementation of page reading; the box runs it in-process for spaces that run as
// its own user, and lchat-pageread runs it under a space's uid for isolated spaces, talking
// to the box over a pipe (wire.go, serve.go, client.go). It imports no Caddy and nothing of
// the box beyond the SQLite driver.
package pageread

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"syscall"
)

// WALPos is how far the box has read a database's WAL: the WAL's identity (file and salts)
// and the end of its committed frames with the running checksum there. While the WAL keeps
// its salts it only grows, so the pages changed since a WALPos are exactly those of the
// committed frames after it.
type WALPos struct {
	Dev, Ino     uint64
	Salt1, Salt2 uint32
	Frames       int64
	Ck1, Ck2     uint32
}

// View is one transactionally consistent, unchanging view of a SQLite database. It holds the
// database's write lock (BEGIN IMMEDIATE on its own connection, or on one a Keeper lends it)
// while pages are read, so no commit, WAL restart or journal-mode change can happen
// meanwhile; a checkpoint of the WAL into the main file may still run, but it only copies
// committed frames, which the view reads from the WAL anyway. A page is read from its newest
// committed WAL frame, else from the main file, exactly as SQLite's own readers do. A tail
// view (since a WALPos) may instead be read without the lock (follow.go).
type View struct {
	// keeper, when set, lends conn and takes it back at Close (keep.go); without one the
	// connection is the view's own.
	keeper *Keeper
	conn   *conn
	locked bool
	main   *os.File
	wal    *os.File

	dev, ino uint64
	pageSize int
	pages    uint32
	// frames maps a page to the offset of its newest committed frame's data in the WAL;
	// with a usable prior WALPos only frames after it are read (tail).
	frames  map[uint32]int64
	pos     WALPos
	walBE   bool
	walSize int64
	hdrCk   [2]uint32
	// tail is true when only the frames after the caller's WALPos were read: the changed
	// pages are then exactly the keys of frames.
	tail bool
	// unlocked: a tail view read without the lock (follow.go); held has the data of each
	// page written since the caller's WALPos, kept from the read its checksums vouched for:
	// it points into bufs, the buffers of that read (followBufs), the view's until close.
	// IndexAll and Scan take the lock (relock, on ctx and path).
	unlocked bool
	held     map[uint32][]byte
	bufs     []*[]byte
	ctx      context.Context
	path     string
}

// Open locks the database at p and reads its shape, on a connection of its own that Close
// ends. since, when non-nil, is the WALPos of the last view: if the WAL is the same file
// with the same salts, only the frames after it are read and view.tail is set.
func Open(ctx context.Context, p string, since *WALPos) (*View, error) {
	return open(ctx, nil, p, since, false)
}

// open is Open on k's kept connection (nil: one of its own). follow lets a tail view be read
// without the lock when its frames vouch for themselves (follow.go): a log segment's, whose
// caller reads only the changed pages. A checkpoint may read any page, and locks.
func open(ctx context.Context, k *Keeper, p string, since *WALPos, follow bool) (*View, error) {
	if follow && since != nil && since.Frames > 0 && !lockedTails {
		if v, ok := followTail(p, since); ok {
			v.keeper, v.ctx, v.path = k, ctx, p
			return v, nil
		}
	}
	return openLocked(ctx, k, p, since)
}

// openLocked is open under the database's write lock.
func openLocked(ctx context.Context, k *Keeper, p string, since *WALPos) (v *View, err error) {
	view := &View{keeper: k, frames: make(map[uint32]int64)}
	defer func() {
		if err != nil {
			view.close() // v is nil by then
		}
	}()
	v = view
	fi, err := v.lock(ctx, p)
	if err != nil {
		return nil, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		v.dev, v.ino = uint64(st.Dev), st.Ino
	}
	hdr := make([]byte, 100)
	if _, err = v.main.ReadAt(hdr, 0); err != nil {
		return nil, fmt.Errorf("reading database header: %w", err)
	}
	v.pageSize = int(binary.BigEndian.Uint16(hdr[16:18]))
	if v.pageSize == 1 {
		v.pageSize = 65536
	}
	if !ValidPageSize(v.pageSize) {
		return nil, fmt.Errorf("database header gives page size %d", v.pageSize)
	}
	v.pages = uint32(fi.Size() / int64(v.pageSize))
	if n := binary.BigEndian.Uint32(hdr[28:32]); n > 0 && string(hdr[24:28]) == string(hdr[92:96]) {
		v.pages = n // the in-header size, valid when stamped by the same change as the counter
	}
	if err = v.readWAL(p+"-wal", since); err != nil {
		return nil, err
	}
	// The instance writes these files: a size no data backs is refused, never allocated for.
	if int64(v.pages)*int64(v.pageSize) > fi.Size()+v.walSize+int64(v.pageSize) {
		return nil, fmt.Errorf("database claims %d pages of %d bytes, more than its files hold", v.pages, v.pageSize)
	}
	return v, nil
}

// lock takes the database's write lock (BEGIN IMMEDIATE) on a connection to the file now
// at p, kept or new, and opens the main file for reading. The lock must be on the file the
// pages are read from: a connection, kept or new, whose file is no longer the one at p (the
// instance renamed another over it) is dropped and a new one tried, and so is a kept one
// that fails to lock for another reason than a writer holding the lock.
func (v *View) lock(ctx context.Context, p string) (os.FileInfo, error) {
	for attempt := 1; ; attempt++ {
		c, kept, err := v.keeper.take(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("opening database: %w", err)
		}
		v.conn = c
		if err := c.begin(ctx); err != nil {
			v.release(busy(err)) // a writer held the lock: the connection is fine
			if kept && ctx.Err() == nil && !busy(err) {
				continue // a kept connection in a bad state: once more, on a new one
			}
			return nil, fmt.Errorf("locking database: %w", err)
		}
		v.locked = true
		f, err := openRegular(p)
		if err != nil {
			return nil, err
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		if dev, ino := fileID(fi); dev == c.dev && ino == c.ino {
			v.main = f
			return fi, nil
		}
		f.Close()
		v.release(false)
		if attempt >= maxLockAttempts {
			return nil, errors.New("the database file was replaced while it was being locked, again and again")
		}
	}
}

// maxLockAttempts bounds how often lock tries again on a file replaced under it: an
// instance that renames files over its database in a loop gets an error, not a livelock.
const maxLockAttempts = 4

// release ends the view's hold on its connection: the write lock is let go (ROLLBACK) and
// the connection goes back to the keeper to keep if keep and it rolled back cleanly, else it
// is closed.
func (v *View) release(keep bool) {
	c := v.conn
	if c == nil {
		return
	}
	v.conn = nil
	if v.locked {
		v.locked = false
		if err := c.rollback(); err != nil {
			keep = false // a connection in a bad state is not kept
		}
	}
	v.keeper.put(c, keep)
}

func fileID(fi os.FileInfo) (dev, ino uint64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev), st.Ino
	}
	return 0, 0
}

// openRegular opens p for reading only if it is a regular file: never through a symlink,
// and never blocking (a FIFO named like the database or its WAL would stall the reader).
func openRegular(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file (%v)", filepath.Base(p), fi.Mode().Type())
	}
	return f, nil
}

// SQLiteURI names the database at path p for the driver. The path is escaped: the instance
// picks its file names, and a raw '?', '#' or '%' in a "file:" URI would make SQLite open
// (and create, empty) another file. mode=rw never creates a database that vanished. The
// instance may hold write locks; busy_timeout waits for them rather than fail.
func SQLiteURI(p string) string {
	u := url.URL{Scheme: "file", Path: p, RawQuery: "mode=rw&_pragma=busy_timeout(10000)"}
	return u.String()
}

// hardening turns off what a crafted schema or page could lean on: schema-defined
// functions and views run by triggers (trusted_schema), memory-mapped reads of a file the
// tenant can truncate (mmap_size), and unchecked cell sizes (cell_size_check).
const hardening = "&_pragma=trusted_schema(0)&_pragma=mmap_size(0)&_pragma=cell_size_check(1)"

// readWAL indexes the committed frames of the WAL, validating salts and checksums the way
// SQLite's recovery does: the first bad frame ends the log, and frames after the last commit
// frame are not part of any transaction.
func (v *View) readWAL(p string, since *WALPos) error {
	f, err := openRegular(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	v.wal = f
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	var dev, ino uint64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		dev, ino = uint64(st.Dev), st.Ino
	}
	hdr := make([]byte, 32)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return nil // empty or truncated WAL: no frames
	}
	magic := binary.BigEndian.Uint32(hdr[0:4])
	if magic&^1 != 0x377f0682 || binary.BigEndian.Uint32(hdr[8:12]) != uint32(v.pageSize) {
		return nil
	}
	be := magic&1 == 1
	ck1, ck2 := walChecksum(be, hdr[:24], 0, 0)
	if ck1 != binary.BigEndian.Uint32(hdr[24:28]) || ck2 != binary.BigEndian.Uint32(hdr[28:32]) {
		return nil
	}
	salt1, salt2 := binary.BigEndian.Uint32(hdr[16:20]), binary.BigEndian.Uint32(hdr[20:24])
	v.walBE, v.walSize, v.hdrCk = be, fi.Size(), [2]uint32{ck1, ck2}
	v.pos = WALPos{Dev: dev, Ino: ino, Salt1: salt1, Salt2: salt2, Ck1: ck1, Ck2: ck2}
	if since != nil && since.Dev == dev && since.Ino == ino && since.Salt1 == salt1 && since.Salt2 == salt2 && since.Frames > 0 {
		v.tail = true
		v.pos.Frames, v.pos.Ck1, v.pos.Ck2 = since.Frames, since.Ck1, since.Ck2
		if err := v.index(); err != nil {
			return err
		}
		if v.pos.Frames == since.Frames {
			// Nothing new committed: the size is the one the last commit gave.
			return v.lastCommitSize(since.Frames)
		}
		return nil
	}
	return v.index()
}

// index reads the committed frames after v.pos into v.frames, advancing v.pos.
func (v *View) index() error {
	frameSize := int64(24 + v.pageSize)
	buf := make([]byte, frameSize)
	pending := make(map[uint32]int64)
	c1, c2 := v.pos.Ck1, v.pos.Ck2
	for i := v.pos.Frames; 32+(i+1)*frameSize <= v.walSize; i++ {
		off := 32 + i*frameSize
		if _, err := v.wal.ReadAt(buf, off); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return err
		}
		var ok bool
		if c1, c2, ok = continues(v.walBE, v.pos.Salt1, v.pos.Salt2, buf, c1, c2); !ok {
			break
		}
		pending[binary.BigEndian.Uint32(buf[0:4])] = off + 24
		if commit := binary.BigEndian.Uint32(buf[4:8]); commit != 0 {
			for pg, o := range pending {
				v.frames[pg] = o
			}
			clear(pending)
			v.pages = commit
			v.pos.Frames, v.pos.Ck1, v.pos.Ck2 = i+1, c1, c2
		}
	}
	return nil
}

// continues reports whether the WAL frame fr (header and page) continues a chain whose
// checksums stand at c1, c2 in a WAL of the given byte order and salts, as SQLite's recovery
// checks it: the frame's salts are the WAL's and its checksum is the chain's over it. It
// returns the chain's checksums after fr.
func continues(be bool, salt1, salt2 uint32, fr []byte, c1, c2 uint32) (uint32, uint32, bool) {
	if binary.BigEndian.Uint32(fr[8:12]) != salt1 || binary.BigEndian.Uint32(fr[12:16]) != salt2 {
		return c1, c2, false
	}
	c1, c2 = walChecksum(be, fr[:8], c1, c2)
	c1, c2 = walChecksum(be, fr[24:], c1, c2)
	return c1, c2, c1 == binary.BigEndian.Uint32(fr[16:20]) && c2 == binary.BigEndian.Uint32(fr[20:24])
}

// changedSinceTail returns the pages written since the caller's WALPos (tail views only).
func (v *View) changedSinceTail() []uint32 { return pagesUpTo(v.frames, v.pages) }

// pagesUpTo lists the pages of m (by page number) within a database of pages pages, ascending.
func pagesUpTo[V any](m map[uint32]V, pages uint32) []uint32 {
	out := make([]uint32, 0, len(m))
	for pg := range m {
		if pg <= pages {
			out = append(out, pg)
		}
	}
	slices.Sort(out)
	return out
}

// indexAll makes every page readable: a tail view knows only the newest frames, but older
// committed frames may not be in the main file yet.
func (v *View) indexAll() error {
	if !v.tail {
		return nil
	}
	newest := v.frames
	end := v.pos
	v.frames = make(map[uint32]int64)
	v.pos.Frames, v.pos.Ck1, v.pos.Ck2 = 0, v.hdrCk[0], v.hdrCk[1]
	pages := v.pages
	if err := v.index(); err != nil {
		return err
	}
	if v.pos != end {
		return errors.New("WAL changed under the write lock")
	}
	for pg, o := range newest {
		v.frames[pg] = o
	}
	v.pages, v.tail = pages, false
	return nil
}

// lastCommitSize reads the database size from the commit frame that ends at frame n.
func (v *View) lastCommitSize(n int64) error {
	b := make([]byte, 8)
	if _, err := v.wal.ReadAt(b, 32+(n-1)*int64(24+v.pageSize)); err != nil {
		return fmt.Errorf("reading WAL: %w", err)
	}
	v.pages = binary.BigEndian.Uint32(b[4:8])
	if v.pages == 0 {
		return errors.New("WAL frame is not a commit frame")
	}
	return nil
}

// walChecksum continues SQLite's WAL checksum over b (a multiple of 8 bytes). Each byte
// order has its own loop: through the binary.ByteOrder interface the sum cost a fifth of a
// log segment's cut. The sum is one chain, each step needing the one before, so its length
// is the cost: written s1 = s1 + x + s2, not s1 += x + s2, a word joins the sum while the
// other sum is still being made, and a step is two additions in a row, not four. Four
// steps a loop behind one bounds check leave the chain alone on the critical path: half
// the time of the plain loop (BenchmarkWALChecksum).
func walChecksum(bigEndian bool, b []byte, s1, s2 uint32) (uint32, uint32) {
	if bigEndian {
		for ; len(b) >= 32; b = b[32:] {
			w := b[:32]
			s1 = s1 + binary.BigEndian.Uint32(w[0:]) + s2
			s2 = s2 + binary.BigEndian.Uint32(w[4:]) + s1
			s1 = s1 + binary.BigEndian.Uint32(w[8:]) + s2
			s2 = s2 + binary.BigEndian.Uint32(w[12:]) + s1
			s1 = s1 + binary.BigEndian.Uint32(w[16:]) + s2
			s2 = s2 + binary.BigEndian.Uint32(w[20:]) + s1
			s1 = s1 + binary.BigEndian.Uint32(w[24:]) + s2
			s2 = s2 + binary.BigEndian.Uint32(w[28:]) + s1
		}
		for ; len(b) >= 8; b = b[8:] {
			s1 = s1 + binary.BigEndian.Uint32(b) + s2
			s2 = s2 + binary.BigEndian.Uint32(b[4:]) + s1
		}
		return s1, s2
	}
	for ; len(b) >= 32; b = b[32:] {
		w := b[:32]
		s1 = s1 + binary.LittleEndian.Uint32(w[0:]) + s2
		s2 = s2 + binary.LittleEndian.Uint32(w[4:]) + s1
		s1 = s1 + binary.LittleEndian.Uint32(w[8:]) + s2
		s2 = s2 + binary.LittleEndian.Uint32(w[12:]) + s1
		s1 = s1 + binary.LittleEndian.Uint32(w[16:]) + s2
		s2 = s2 + binary.LittleEndian.Uint32(w[20:]) + s1
		s1 = s1 + binary.LittleEndian.Uint32(w[24:]) + s2
		s2 = s2 + binary.LittleEndian.Uint32(w[28:]) + s1
	}
	for ; len(b) >= 8; b = b[8:] {
		s1 = s1 + binary.LittleEndian.Uint32(b) + s2
		s2 = s2 + binary.LittleEndian.Uint32(b[4:]) + s1
	}
	return s1, s2
}

// scanBlock is how much of the main file scan reads at a time: large enough that the
// system calls cost little next to the copy, small enough to stay in a core's cache while
// fn reads it, and a quarter of the garbage of the 1 MiB it was.
const scanBlock = 256 << 10

// readPage reads page pgno (1-based) into buf.
func (v *View) readPage(pgno uint32, buf []byte) error {
	if v.unlocked {
		return v.readHeld(pgno, buf)
	}
	if off, ok := v.frames[pgno]; ok {
		_, err := v.wal.ReadAt(buf, off)
		return err
	}
	n, err := v.main.ReadAt(buf, int64(pgno-1)*int64(v.pageSize))
	if errors.Is(err, io.EOF) {
		clear(buf[n:]) // allocated but never written: SQLite reads zeros too
		err = nil
	}
	return err
}

// scan calls fn for every page in order, reading the main file in blocks of scanBlock
// bytes (or the whole database, when smaller). data is only valid during the call.
func (v *View) scan(fn func(pgno uint32, data []byte) error) error {
	per := max(1, min(scanBlock/v.pageSize, int(v.pages)))
	buf := make([]byte, per*v.pageSize)
	for first := uint32(1); first <= v.pages; first += uint32(per) {
		n := min(uint32(per), v.pages-first+1)
		b := buf[:int(n)*v.pageSize]
		got, err := v.main.ReadAt(b, int64(first-1)*int64(v.pageSize))
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		clear(b[got:])
		for i := uint32(0); i < n; i++ {
			pg := b[int(i)*v.pageSize : int(i+1)*v.pageSize]
			if off, ok := v.frames[first+i]; ok {
				if _, err := v.wal.ReadAt(pg, off); err != nil {
					return err
				}
			}
			if err := fn(first+i, pg); err != nil {
				return err
			}
		}
	}
	return nil
}

func (v *View) close() {
	v.held = nil
	releaseFollowBufs(v.bufs)
	v.bufs = nil
	v.release(true)
	if v.main != nil {
		v.main.Close()
		v.main = nil
	}
	if v.wal != nil {
		v.wal.Close()
		v.wal = nil
	}
}

// Shape is what a view found when it opened: the main file's identity, the page size, the
// database's size in pages, how far the WAL was read, and whether only the frames after
// the caller's WALPos were read (Tail; IndexAll clears it).
type Shape struct {
	Dev, Ino uint64
	PageSize int
	Pages    uint32
	Pos      WALPos
	Tail     bool
}

// Source is one consistent view of a database, read in this process (View) or by
// lchat-pageread under the space's uid (Client). Page data passed to fn is valid only
// during the call.
type Source interface {
	Shape() Shape
	// ChangedSinceTail lists the pages written since the caller's WALPos, ascending
	// (tail views only).
	ChangedSinceTail() ([]uint32, error)
	// IndexAll makes every page readable in a tail view (older committed frames may not
	// be in the main file yet).
	IndexAll() error
	// ReadPages reads the given pages (each in 1..Pages) in order.
	ReadPages(pgnos []uint32, fn func(pgno uint32, data []byte) error) error
	// Scan reads every page in order.
	Scan(fn func(pgno uint32, data []byte) error) error
	Close() error
}

// Shape returns what the view found.
func (v *View) Shape() Shape {
	return Shape{Dev: v.dev, Ino: v.ino, PageSize: v.pageSize, Pages: v.pages, Pos: v.pos, Tail: v.tail}
}

// ChangedSinceTail lists the pages written since the caller's WALPos.
func (v *View) ChangedSinceTail() ([]uint32, error) {
	if v.unlocked {
		return v.heldChanged(), nil
	}
	return v.changedSinceTail(), nil
}

// IndexAll makes every page readable: an unlocked tail view takes the lock and reads the
// database afresh (its shape then moves on to what is committed now).
func (v *View) IndexAll() error {
	if v.unlocked {
		return v.relock()
	}
	return v.indexAll()
}

// ReadPages reads pgnos in order.
func (v *View) ReadPages(pgnos []uint32, fn func(pgno uint32, data []byte) error) error {
	buf := make([]byte, v.pageSize)
	for _, pg := range pgnos {
		if pg < 1 || pg > v.pages {
			return fmt.Errorf("page %d is outside the database (%d pages)", pg, v.pages)
		}
		if err := v.readPage(pg, buf); err != nil {
			return fmt.Errorf("reading page %d: %w", pg, err)
		}
		if err := fn(pg, buf); err != nil {
			return err
		}
	}
	return nil
}

// Scan reads every page in order (an unlocked tail view takes the lock first, as IndexAll).
func (v *View) Scan(fn func(pgno uint32, data []byte) error) error {
	if v.unlocked {
		if err := v.relock(); err != nil {
			return err
		}
	}
	return v.scan(fn)
}

// Close ends the view and releases the write lock (and the connection, unless a Keeper
// keeps it). It is idempotent.
func (v *View) Close() error {
	v.close()
	return nil
}

// Interface guards
var _ Source = (*View)(nil)

// ValidPageSize reports whether n is a page size SQLite can have: a power of two from 512
// to 65536.
func ValidPageSize(n int) bool { return n >= 512 && n <= 65536 && n&(n-1) == 0 }
