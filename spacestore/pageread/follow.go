package pageread

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// A tail view without the lock. A log segment after a group of commits needs only the
// frames committed since the last one (a WALPos), and those can be read the way SQLite's
// own recovery reads a WAL, with no lock and no connection: each frame carries the WAL's
// salts and a checksum chained from the frame before, so a frame torn by a write in
// progress, one left from an earlier use of the file, or one of a transaction that spilled
// and rolled back breaks the chain or the salts, and only frames up to a commit frame that
// ends an unbroken chain from the WALPos are taken. The page data is kept from the same
// read that checked them, so a later overwrite cannot change what was taken.
//
// What the lock prevented is then checked instead:
//   - A commit in progress: its frames are not taken until its commit frame is written.
//   - A WAL restart (after a checkpoint, the instance's next write starts the WAL again
//     with new salts, writing the header before any frame): the header is read before and
//     after the frames, and a change, new salts, or a file shorter than the WALPos means
//     the commits since may be in the main file by now and the WAL overwritten; the view
//     takes the lock instead, as it always did.
//   - Another file at the WAL's path (a WALPos names its device and inode), a tail larger
//     than maxFollowBytes: the lock.
//
// The main file is never read: a tail view's changed pages are all in the frames it took.
// What needs every page (IndexAll, Scan: the database was replaced under the caller's
// state) takes the lock then, and reads it all.

// maxFollowBytes bounds the frames a tail view reads without the lock; a larger tail (the
// first segment after a long pause) is read under the lock, page by page.
const maxFollowBytes = 8 << 20

// lockedTails (a benchmark's comparison) reads every tail view under the lock.
var lockedTails = false

// followChunk is how many frames a tail view without the lock reads first; each further
// read doubles it.
const followChunk = 32

// followHook, when set (a test), runs between the read of the frames and the second read
// of the WAL header: a WAL restarted there must not go unnoticed.
var followHook func()

// followTail reads the frames committed in the WAL of the database at p since the caller's
// WALPos, without the lock; ok false when it cannot vouch for what it read, or cannot read
// it (the caller takes the lock, and meets any error there).
func followTail(p string, since *WALPos) (v *View, ok bool) {
	mfi, err := os.Lstat(p)
	if err != nil || !mfi.Mode().IsRegular() {
		return nil, false
	}
	f, err := openRegular(p + "-wal")
	if err != nil {
		return nil, false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, false
	}
	if dev, ino := fileID(fi); dev != since.Dev || ino != since.Ino {
		return nil, false
	}
	var hdr, again [32]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		return nil, false
	}
	magic := binary.BigEndian.Uint32(hdr[0:4])
	pageSize := int(binary.BigEndian.Uint32(hdr[8:12]))
	if magic&^1 != 0x377f0682 || !ValidPageSize(pageSize) {
		return nil, false
	}
	be := magic&1 == 1
	ck1, ck2 := walChecksum(be, hdr[:24], 0, 0)
	if ck1 != binary.BigEndian.Uint32(hdr[24:28]) || ck2 != binary.BigEndian.Uint32(hdr[28:32]) ||
		binary.BigEndian.Uint32(hdr[16:20]) != since.Salt1 || binary.BigEndian.Uint32(hdr[20:24]) != since.Salt2 {
		return nil, false
	}
	frameSize := int64(24 + pageSize)
	start := 32 + since.Frames*frameSize
	if fi.Size() < start {
		return nil, false
	}
	v = &View{pageSize: pageSize, walBE: be, walSize: fi.Size(), hdrCk: [2]uint32{ck1, ck2},
		pos: *since, tail: true, unlocked: true, held: make(map[uint32][]byte)}
	v.dev, v.ino = fileID(mfi)
	// The file may run on past the last commit with frames of an earlier use of it (a WAL
	// restarted reuses its file): the frames are read in chunks, from followChunk frames
	// doubling, up to the first that breaks the chain.
	pending := make(map[uint32][]byte)
	c1, c2 := since.Ck1, since.Ck2
	off, read, chunk := start, int64(0), int64(followChunk)
	for valid := true; valid && off+frameSize <= fi.Size(); chunk *= 2 {
		n := min(chunk*frameSize, (fi.Size()-off)/frameSize*frameSize)
		if read += n; read > maxFollowBytes {
			return nil, false
		}
		buf := make([]byte, n)
		got, err := f.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, false
		}
		buf = buf[:int64(got)/frameSize*frameSize]
		if int64(len(buf)) < n {
			valid = false // the file ended early: nothing more to read
		}
		for i := int64(0); (i+1)*frameSize <= int64(len(buf)); i++ {
			fr := buf[i*frameSize : (i+1)*frameSize]
			if c1, c2, valid = continues(be, since.Salt1, since.Salt2, fr, c1, c2); !valid {
				break
			}
			pending[binary.BigEndian.Uint32(fr[0:4])] = fr[24:]
			if commit := binary.BigEndian.Uint32(fr[4:8]); commit != 0 {
				for pg, data := range pending {
					v.held[pg] = data
				}
				clear(pending)
				v.pages = commit
				v.pos.Frames, v.pos.Ck1, v.pos.Ck2 = (off-32)/frameSize+i+1, c1, c2
			}
		}
		off += int64(len(buf))
	}
	if v.pages == 0 {
		// Nothing new committed: the size is the one the last commit gave.
		var b [8]byte
		if _, err := f.ReadAt(b[:], 32+(since.Frames-1)*frameSize); err != nil {
			return nil, false
		}
		if v.pages = binary.BigEndian.Uint32(b[4:8]); v.pages == 0 {
			return nil, false
		}
	}
	if followHook != nil {
		followHook()
	}
	if _, err := f.ReadAt(again[:], 0); err != nil || !bytes.Equal(hdr[:], again[:]) {
		return nil, false
	}
	return v, true
}

// relock turns an unlocked tail view into a full view under the lock: what needs every
// page (IndexAll, Scan) reads them there.
func (v *View) relock() error {
	nv, err := openLocked(v.ctx, v.keeper, v.path, nil)
	if err != nil {
		return err
	}
	*v = *nv
	return nil
}

// heldChanged lists an unlocked view's changed pages within the database, ascending.
func (v *View) heldChanged() []uint32 { return pagesUpTo(v.held, v.pages) }

// readHeld reads a page an unlocked view took.
func (v *View) readHeld(pgno uint32, buf []byte) error {
	data, ok := v.held[pgno]
	if !ok {
		return fmt.Errorf("page %d was not written since the view's WAL position", pgno)
	}
	copy(buf, data)
	return nil
}
