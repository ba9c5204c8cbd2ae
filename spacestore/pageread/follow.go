package pageread

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"sync"
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
//     after the frames, and a change means the frames read may have been overwritten; the
//     view takes the lock instead. A restart before the read is followed when it is the
//     only one since the WALPos and the old frames since it are provably all still there
//     (followTail says how); otherwise (two restarts, a WAL truncated, a file shorter than
//     the WALPos) the commits since may be in the main file only, and the view takes the
//     lock, and its caller compares every page.
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

// followRead is how many bytes a tail view without the lock reads at a time (32 frames of
// 4 KiB pages; at least one frame of any page size), and the size of every buffer it
// reads into (followBufs). A cut reads one or two to take a few frames; a long tail reads
// on in as many as it takes, the system calls being cheap next to copying the frames.
const followRead = 32 * (24 + 4096)

// followHook, when set (a test), runs between the read of the frames and the second read
// of the WAL header: a WAL restarted there must not go unnoticed.
var followHook func()

// followTail reads the frames committed in the WAL of the database at p since the caller's
// WALPos, without the lock; ok false when it cannot vouch for what it read, or cannot read
// it (the caller takes the lock, and meets any error there).
//
// A WAL restarted once since the WALPos (SQLite adds 1 to the first salt at each restart)
// is followed too, so the cut after each restart need not compare every page of the
// database: the commits since the WALPos are then the old salts' frames after it, which
// the restart's checkpoint copied into the main file and the new frames have not yet
// overwritten, and the new salts' frames from the start of the file. The old frames are
// vouched for by their chain from the WALPos, like any tail; what ends that chain must
// show they ended there: a frame of an earlier use of the file, or one the old salts left
// behind a rollback (old salts, a broken chain). The chain may not end at the end of the
// file, which a journal_size_limit may have truncated over them, nor at a frame of the new
// salts, which has overwritten them; and the frame there is read again after the frames,
// since the new frames may have reached it meanwhile (a frame's header is written before
// its page, so a torn read is seen afterwards).
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
	if ck1 != binary.BigEndian.Uint32(hdr[24:28]) || ck2 != binary.BigEndian.Uint32(hdr[28:32]) {
		return nil, false
	}
	salt1, salt2 := binary.BigEndian.Uint32(hdr[16:20]), binary.BigEndian.Uint32(hdr[20:24])
	restarted := salt1 != since.Salt1 || salt2 != since.Salt2
	if restarted && salt1 != since.Salt1+1 {
		return nil, false // restarted more than once: the frames of the restarts between are gone
	}
	frameSize := int64(24 + pageSize)
	if fi.Size() < 32+since.Frames*frameSize {
		return nil, false
	}
	w := walFile{f: f, size: fi.Size(), be: be, frameSize: frameSize, budget: maxFollowBytes}
	defer w.release() // unless the view takes the buffers
	v = &View{pageSize: pageSize, walBE: be, walSize: fi.Size(), hdrCk: [2]uint32{ck1, ck2},
		pos: *since, tail: true, unlocked: true}
	v.dev, v.ino = fileID(mfi)
	var cur, old chain
	if !restarted {
		if cur, ok = w.chain(salt1, salt2, since.Frames, since.Ck1, since.Ck2); !ok {
			return nil, false
		}
		v.held = cur.held
	} else {
		if cur, ok = w.chain(salt1, salt2, 0, ck1, ck2); !ok || cur.frames == 0 {
			return nil, false // no commit since the restart yet: the lock will tell
		}
		if old, ok = w.chain(since.Salt1, since.Salt2, since.Frames, since.Ck1, since.Ck2); !ok || !old.endsAtFrame ||
			old.endSalts == [2]uint32{salt1, salt2} {
			return nil, false
		}
		v.held = old.held
		maps.Copy(v.held, cur.held)
		v.pos.Salt1, v.pos.Salt2 = salt1, salt2
	}
	if cur.frames > 0 {
		v.pages = cur.pages
		v.pos.Frames, v.pos.Ck1, v.pos.Ck2 = cur.frames, cur.ck1, cur.ck2
	} else {
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
	if restarted {
		var fh [24]byte
		if _, err := f.ReadAt(fh[:], 32+old.end*frameSize); err != nil ||
			binary.BigEndian.Uint32(fh[8:12]) == salt1 && binary.BigEndian.Uint32(fh[12:16]) == salt2 {
			return nil, false // the new frames reached the old ones' end: they may have overwritten it
		}
	}
	v.bufs, w.bufs = w.bufs, nil // v.held points into them
	return v, true
}

// walFile is a WAL read without the lock.
type walFile struct {
	f         *os.File
	size      int64 // as stat found it first: frames past it are not read
	be        bool
	frameSize int64
	budget    int64 // the bytes left to read (maxFollowBytes in all)
	bufs      []*[]byte
}

// followBufs keeps the buffers of tail reads (followRead bytes each): a cut reads 32
// frames or more (over 128 KiB of 4 KiB pages) to take a few. The view that took pages from
// a read keeps its buffers until it ends (View.close gives them back); nothing else points
// into them, and a page leaves the view only as a copy (readHeld), so what the view took
// stays as it was read, and no page handed out is overwritten by a later tail's read.
var followBufs sync.Pool

// buffer is n (at most followRead) bytes to read frames into, held until release.
func (w *walFile) buffer(n int64) []byte {
	p, _ := followBufs.Get().(*[]byte)
	if p == nil {
		b := make([]byte, followRead)
		p = &b
	}
	w.bufs = append(w.bufs, p)
	return (*p)[:n]
}

// release gives w's buffers back: nothing read into them may be used after it.
func (w *walFile) release() {
	releaseFollowBufs(w.bufs)
	w.bufs = nil
}

func releaseFollowBufs(bufs []*[]byte) {
	for _, p := range bufs {
		followBufs.Put(p)
	}
}

// chain is what walFile.chain read: the frames that continue a chain up to its last commit.
type chain struct {
	held     map[uint32][]byte // each page's data in the newest of those frames
	frames   int64             // the index after the last commit frame; 0 when none
	pages    uint32            // the database's size in pages at that commit
	ck1, ck2 uint32            // the chain's checksum at that commit
	// end is the index of the first frame that does not continue the chain; endsAtFrame
	// whether one is there (not the end of the file), endSalts its salts.
	end         int64
	endsAtFrame bool
	endSalts    [2]uint32
}

// chain reads the frames from index from on while they carry salts and continue the
// checksum chain from (c1, c2), followRead bytes at a time (the file may run on past the
// last commit with frames of an earlier use of it); ok false on a read error or past the
// budget.
func (w *walFile) chain(salt1, salt2 uint32, from int64, c1, c2 uint32) (ch chain, ok bool) {
	ch.held = make(map[uint32][]byte)
	pending := make(map[uint32][]byte)
	off, per := 32+from*w.frameSize, followRead/w.frameSize
	for {
		if off+w.frameSize > w.size {
			ch.end = (off - 32) / w.frameSize
			return ch, true // the end of the file
		}
		n := min(per*w.frameSize, (w.size-off)/w.frameSize*w.frameSize)
		if w.budget -= n; w.budget < 0 {
			return ch, false
		}
		buf := w.buffer(n)
		got, err := w.f.ReadAt(buf, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return ch, false
		}
		buf = buf[:int64(got)/w.frameSize*w.frameSize]
		for i := int64(0); (i+1)*w.frameSize <= int64(len(buf)); i++ {
			fr := buf[i*w.frameSize : (i+1)*w.frameSize]
			var valid bool
			if c1, c2, valid = continues(w.be, salt1, salt2, fr, c1, c2); !valid {
				ch.end, ch.endsAtFrame = (off-32)/w.frameSize+i, true
				ch.endSalts = [2]uint32{binary.BigEndian.Uint32(fr[8:12]), binary.BigEndian.Uint32(fr[12:16])}
				return ch, true
			}
			pending[binary.BigEndian.Uint32(fr[0:4])] = fr[24:]
			if commit := binary.BigEndian.Uint32(fr[4:8]); commit != 0 {
				maps.Copy(ch.held, pending)
				clear(pending)
				ch.pages = commit
				ch.frames, ch.ck1, ch.ck2 = (off-32)/w.frameSize+i+1, c1, c2
			}
		}
		if int64(len(buf)) < n {
			ch.end = (off - 32 + int64(len(buf))) / w.frameSize
			return ch, true // the file ended early
		}
		off += int64(len(buf))
	}
}

// relock turns an unlocked tail view into a full view under the lock: what needs every
// page (IndexAll, Scan) reads them there.
func (v *View) relock() error {
	nv, err := openLocked(v.ctx, v.keeper, v.path, nil)
	if err != nil {
		return err
	}
	releaseFollowBufs(v.bufs)
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
