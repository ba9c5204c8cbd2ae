package spacestore

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"slices"
	"syscall"

	"github.com/cespare/xxhash/v2"
)

// walPos is how far this box has read a database's WAL: the WAL's identity (file and salts)
// and the end of its committed frames with the running checksum there. While the WAL keeps
// its salts it only grows, so the pages changed since a walPos are exactly those of the
// committed frames after it.
type walPos struct {
	Dev, Ino     uint64
	Salt1, Salt2 uint32
	Frames       int64
	Ck1, Ck2     uint32
}

// dbView is one transactionally consistent, unchanging view of a SQLite database. It holds the
// database's write lock (BEGIN IMMEDIATE on its own connection) while pages are read, so no
// commit, WAL restart or journal-mode change can happen meanwhile; a checkpoint of the WAL
// into the main file may still run, but it only copies committed frames, which the view reads
// from the WAL anyway. A page is read from its newest committed WAL frame, else from the main
// file, exactly as SQLite's own readers do.
type dbView struct {
	db   *sql.DB
	conn *sql.Conn
	main *os.File
	wal  *os.File

	dev, ino uint64
	pageSize int
	pages    uint32
	// frames maps a page to the offset of its newest committed frame's data in the WAL;
	// with a usable prior walPos only frames after it are read (tail).
	frames  map[uint32]int64
	pos     walPos
	walBE   bool
	walSize int64
	hdrCk   [2]uint32
	// tail is true when only the frames after the caller's walPos were read: the changed
	// pages are then exactly the keys of frames.
	tail bool
}

// openView locks the database at p and reads its shape. since, when non-nil, is the walPos
// of the last view: if the WAL is the same file with the same salts, only the frames after it
// are read and view.tail is set.
func openView(ctx context.Context, p string, since *walPos) (v *dbView, err error) {
	view := &dbView{frames: make(map[uint32]int64)}
	defer func() {
		if err != nil {
			view.close() // v is nil by then
		}
	}()
	v = view
	if v.db, err = sql.Open("sqlite", sqliteURI(p)); err != nil {
		return nil, err
	}
	v.db.SetMaxOpenConns(1)
	if v.conn, err = v.db.Conn(ctx); err != nil {
		return nil, fmt.Errorf("opening database: %w", err)
	}
	if _, err = v.conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return nil, fmt.Errorf("locking database: %w", err)
	}
	if v.main, err = os.Open(p); err != nil {
		return nil, err
	}
	fi, err := v.main.Stat()
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
	if !validPageSize(v.pageSize) {
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

// readWAL indexes the committed frames of the WAL, validating salts and checksums the way
// SQLite's recovery does: the first bad frame ends the log, and frames after the last commit
// frame are not part of any transaction.
func (v *dbView) readWAL(p string, since *walPos) error {
	f, err := os.Open(p)
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
	v.pos = walPos{Dev: dev, Ino: ino, Salt1: salt1, Salt2: salt2, Ck1: ck1, Ck2: ck2}
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
func (v *dbView) index() error {
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
		if binary.BigEndian.Uint32(buf[8:12]) != v.pos.Salt1 || binary.BigEndian.Uint32(buf[12:16]) != v.pos.Salt2 {
			break
		}
		c1, c2 = walChecksum(v.walBE, buf[:8], c1, c2)
		c1, c2 = walChecksum(v.walBE, buf[24:], c1, c2)
		if c1 != binary.BigEndian.Uint32(buf[16:20]) || c2 != binary.BigEndian.Uint32(buf[20:24]) {
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

// changedSinceTail returns the pages written since the caller's walPos (tail views only).
func (v *dbView) changedSinceTail() []uint32 {
	out := make([]uint32, 0, len(v.frames))
	for pg := range v.frames {
		if pg <= v.pages {
			out = append(out, pg)
		}
	}
	slices.Sort(out)
	return out
}

// indexAll makes every page readable: a tail view knows only the newest frames, but older
// committed frames may not be in the main file yet.
func (v *dbView) indexAll() error {
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
func (v *dbView) lastCommitSize(n int64) error {
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

// walChecksum continues SQLite's WAL checksum over b (a multiple of 8 bytes).
func walChecksum(bigEndian bool, b []byte, s1, s2 uint32) (uint32, uint32) {
	order := binary.ByteOrder(binary.LittleEndian)
	if bigEndian {
		order = binary.BigEndian
	}
	for i := 0; i+8 <= len(b); i += 8 {
		s1 += order.Uint32(b[i:]) + s2
		s2 += order.Uint32(b[i+4:]) + s1
	}
	return s1, s2
}

// readPage reads page pgno (1-based) into buf.
func (v *dbView) readPage(pgno uint32, buf []byte) error {
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

// scan calls fn for every page in order, reading the main file in large blocks. data is
// only valid during the call.
func (v *dbView) scan(fn func(pgno uint32, data []byte) error) error {
	const block = 1 << 20
	per := max(1, block/v.pageSize)
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

func (v *dbView) close() {
	if v.conn != nil {
		v.conn.ExecContext(context.Background(), "ROLLBACK")
		v.conn.Close()
	}
	if v.db != nil {
		v.db.Close()
	}
	if v.main != nil {
		v.main.Close()
	}
	if v.wal != nil {
		v.wal.Close()
	}
}

// pageHash identifies a page's content at its position; a database's checksum is the XOR of
// its pages' hashes, so a delta updates it in time proportional to the pages it changes.
func pageHash(pgno uint32, data []byte) uint64 {
	return xxhash.Sum64(data) ^ bits.RotateLeft64(uint64(pgno)*0x9e3779b97f4a7c15, 29)
}

// lockPgno is the page holding SQLite's lock bytes (at 1 GiB), never written by SQLite.
func lockPgno(pageSize int) uint32 { return uint32(0x40000000/pageSize) + 1 }

func statID(fi os.FileInfo) (dev, ino uint64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev), st.Ino
	}
	return 0, 0
}
