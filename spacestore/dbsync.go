package spacestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math/bits"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/superfly/ltx"

	"github.com/lchat/lchat-caddy/spacestore/pageread"
)

// dbState is what this box knows of one database's last checkpointed image: per-page hashes
// to find changed pages, the WAL position read so far, and the pages each delta holds (to
// merge and rebase without downloading anything).
type dbState struct {
	dev, ino   uint64
	img        *DBImage
	hashes     []uint64 // by pgno-1
	sum        uint64
	wal        pageread.WALPos
	deltaPages [][]uint32 // parallel to img.Deltas
	// v1 is the format-1 manifest entry of a database restored from a whole-file blob: the
	// image is that blob as a single base chunk, and while nothing changes the entry stays
	// as it was (no manifest write just to migrate).
	v1 *File
	// shipped: a log shipper's read made this state, whose hashes no other state or base
	// shares; once the shipper replaces the state, the next may take them (LogShipper.spare).
	shipped bool
}

// dbResult is one database's checkpoint: the manifest entry, the state to keep once the
// manifest is written, and what it cost.
type dbResult struct {
	file         File
	state        *dbState
	pagesChanged int
	fullScan     bool
}

// checkpointDB checkpoints the database at abs for generation gen in three steps: detect the
// pages changed since prev, this box's last image of it (detectChanges); plan the new image
// (planDB: the chain policy and what mode folds); upload what the plan writes (writeDB).
func (s *Syncer) checkpointDB(ctx context.Context, abs string, gen int64, prev *dbState, mode Mode, now time.Time, up *uploader) (dbResult, error) {
	var since *pageread.WALPos
	if prev != nil && prev.wal.Frames > 0 {
		since = &prev.wal
	}
	v, err := s.openPages(ctx, abs, since)
	if err != nil {
		return dbResult{}, err
	}
	defer v.Close()
	ch, err := detectChanges(v, prev, nil, nil)
	if err != nil {
		return dbResult{}, err
	}
	p := planDB(prev, ch, mode, gen)
	if err := s.writeDB(ctx, v, p, gen, now, up); err != nil {
		return dbResult{}, err
	}
	ns := ch.state
	ns.img, ns.deltaPages = p.img, p.deltaPages
	res := dbResult{state: ns, pagesChanged: len(ch.changed), fullScan: ch.fullScan,
		file: File{Size: ch.size(), Content: &Content{DB: p.img}}}
	if p.step == stepKeep && prev.v1 != nil {
		ns.v1, res.file = prev.v1, *prev.v1
	}
	return res, nil
}

// dbChanges is what detectChanges found in a database.
type dbChanges struct {
	// state is the database's new identity, WAL position and page hashes; planDB's image
	// and deltaPages complete it.
	state *dbState
	// usable: the prior image is of this file (device and inode) with this page size, so
	// changed is relative to it; else every page counts as changed.
	usable   bool
	changed  []uint32
	pages    uint32
	pageSize int
	// fullScan: every page was read and hashed (no usable WAL position).
	fullScan bool
}

func (ch dbChanges) size() int64 { return int64(ch.pages) * int64(ch.pageSize) }

// sameFile reports whether a view of shape sh is of the file st was taken from (device and
// inode) with the same page size: st's page hashes then stand for it. A nil st is of no file.
func (st *dbState) sameFile(sh pageread.Shape) bool {
	return st != nil && st.dev == sh.Dev && st.ino == sh.Ino && st.img.PageSize == sh.PageSize
}

// detectChanges finds the pages of the view that differ from prev: from the WAL tail when
// the WAL kept its identity since prev, else by one scan that hashes every page. hold, if
// not nil, keeps a copy of each changed page as it is read (up to its limit). spare, if not
// nil, is memory no state uses any more, which the new state's hashes may take.
func detectChanges(v pageread.Source, prev *dbState, hold *heldPages, spare []uint64) (dbChanges, error) {
	sh := v.Shape()
	usable := prev.sameFile(sh)
	if !usable && sh.Tail {
		if err := v.IndexAll(); err != nil {
			return dbChanges{}, err
		}
		sh = v.Shape()
	}
	ns := &dbState{dev: sh.Dev, ino: sh.Ino, wal: sh.Pos}
	ch := dbChanges{state: ns, usable: usable, pages: sh.Pages, pageSize: sh.PageSize}
	if usable && sh.Tail {
		ns.hashes = append(spare[:0], prev.hashes...)
		ns.sum = prev.sum
		for i := int(sh.Pages); i < len(ns.hashes); i++ {
			ns.sum ^= ns.hashes[i]
		}
		if int(sh.Pages) < len(ns.hashes) {
			ns.hashes = ns.hashes[:sh.Pages]
		} else {
			ns.hashes = append(ns.hashes, make([]uint64, int(sh.Pages)-len(ns.hashes))...)
		}
		changed, err := v.ChangedSinceTail()
		if err != nil {
			return dbChanges{}, err
		}
		hold.reserve(len(changed), sh.PageSize)
		err = v.ReadPages(changed, func(pg uint32, page []byte) error {
			if h := pageHash(pg, page); h != ns.hashes[pg-1] {
				ns.sum ^= ns.hashes[pg-1] ^ h
				ns.hashes[pg-1] = h
				ch.changed = append(ch.changed, pg)
				hold.add(pg, page)
			}
			return nil
		})
		if err != nil {
			return dbChanges{}, err
		}
		return ch, nil
	}
	ch.fullScan = true
	ns.hashes = make([]uint64, sh.Pages)
	err := v.Scan(func(pg uint32, data []byte) error {
		h := pageHash(pg, data)
		ns.hashes[pg-1] = h
		ns.sum ^= h
		if !usable || int(pg) > len(prev.hashes) || prev.hashes[pg-1] != h {
			ch.changed = append(ch.changed, pg)
			hold.add(pg, data)
		}
		return nil
	})
	if err != nil {
		return dbChanges{}, fmt.Errorf("reading pages: %w", err)
	}
	return ch, nil
}

// writeDB uploads what plan p writes, read from the view, and fills in the references of
// p.img.
func (s *Syncer) writeDB(ctx context.Context, v pageread.Source, p dbPlan, gen int64, now time.Time, up *uploader) error {
	switch p.step {
	case stepNewBase, stepRebase:
		if err := v.IndexAll(); err != nil {
			return err
		}
		return s.writeBase(ctx, v, p.img, p.oldBase, p.dirty, gen, up)
	case stepDeltas:
		for i := range p.fresh {
			if len(p.deltaPages[i]) > 0 && p.img.Deltas[i].Level > 0 {
				// A merged delta holds pages older than the WAL's tail.
				if err := v.IndexAll(); err != nil {
					return err
				}
			}
			data, err := encodeDelta(v, p.deltaPages[i], p.img.Deltas[i].MinGen, gen, now)
			if err != nil {
				return err
			}
			ref, err := up.put(ctx, gen, data)
			if err != nil {
				return err
			}
			p.img.Deltas[i].Ref = ref
		}
	}
	return nil
}

// writeBase sets img.Base to raw page ranges of the view. A chunk whose pages are not in
// dirty and whose extent is unchanged keeps its old object (old[i]); nil dirty rewrites all.
func (s *Syncer) writeBase(ctx context.Context, v pageread.Source, img *DBImage, old []Ref, dirty map[uint32]bool, gen int64, up *uploader) error {
	size := int64(img.Pages) * int64(img.PageSize)
	per := uint32(img.ChunkBytes / int64(img.PageSize))
	img.Base = nil
	for i := int64(0); i*img.ChunkBytes < size; i++ {
		first := uint32(i)*per + 1
		n := min(per, img.Pages-first+1)
		keep := dirty != nil && int(i) < len(old) && old[i].Size == int64(n)*int64(img.PageSize)
		for pg := first; keep && pg < first+n; pg++ {
			keep = !dirty[pg]
		}
		if keep {
			img.Base = append(img.Base, old[i])
			continue
		}
		buf := make([]byte, int(n)*img.PageSize)
		pgs := make([]uint32, n)
		for j := range pgs {
			pgs[j] = first + uint32(j)
		}
		err := v.ReadPages(pgs, func(pg uint32, data []byte) error {
			copy(buf[int(pg-first)*img.PageSize:], data)
			return nil
		})
		if err != nil {
			return fmt.Errorf("reading pages: %w", err)
		}
		if int(i) < len(old) && old[i].SHA256 == sha256Hex(buf) {
			img.Base = append(img.Base, old[i])
			continue
		}
		ref, err := up.put(ctx, gen, buf)
		if err != nil {
			return err
		}
		img.Base = append(img.Base, ref)
	}
	return nil
}

// encodeDelta writes pages of the view as one LTX file. Page checksums are off (the object's
// SHA-256 and the image checksum guard the content); LTX's own file checksum stays.
func encodeDelta(v pageread.Source, pages []uint32, minGen, maxGen int64, now time.Time) ([]byte, error) {
	return encodePages(v.Shape(), v.ReadPages, pages, minGen, maxGen, now)
}

// heldPages are copies of pages read under a view, in ascending page order, kept for after
// the view ends: the log shipper encodes its segment from them once it has let the
// database's write lock go, so the instance's writers wait for the read only, not for the
// encoding (and an isolated space's pages cross the helper's pipe once). Past limit bytes
// it keeps nothing (over), and the caller reads from the view as before. Its slab comes
// from heldSlabs and goes back at release.
type heldPages struct {
	limit int
	over  bool
	pgs   []uint32
	slab  []byte  // the pages in pgs' order, each of the database's page size
	box   *[]byte // slab's box in heldSlabs, nil for a slab of its own making
}

// heldSlabs keeps the slabs of heldPages (each in a box, so a Put allocates nothing): a
// cut copies its changed pages into one, tens of KiB every few ms of a busy space.
// Slabs of more than maxPooledSlab bytes are left to the GC.
var heldSlabs sync.Pool

const (
	minHeldSlab   = 64 << 10
	maxPooledSlab = 1 << 20
)

// reserve makes room for n pages of pageSize bytes at once (a tail's changed pages).
func (h *heldPages) reserve(n, pageSize int) {
	if h == nil || h.over || len(h.slab) != 0 || n*pageSize > h.limit {
		return
	}
	p, _ := heldSlabs.Get().(*[]byte)
	if p == nil || cap(*p) < n*pageSize {
		b := make([]byte, 0, max(n*pageSize, minHeldSlab))
		p = &b
	}
	h.box, h.slab, h.pgs = p, (*p)[:0], make([]uint32, 0, n)
}

// add keeps a copy of page pg, read after every page added before it. A nil h keeps nothing.
func (h *heldPages) add(pg uint32, data []byte) {
	if h == nil || h.over {
		return
	}
	if len(h.slab)+len(data) > h.limit {
		h.release()
		h.over = true
		return
	}
	h.pgs = append(h.pgs, pg)
	h.slab = append(h.slab, data...)
}

// release gives h's slab back for another cut's: nothing read from h may be used after it.
func (h *heldPages) release() {
	if h == nil || h.slab == nil {
		return
	}
	if cap(h.slab) <= maxPooledSlab {
		if h.box == nil {
			h.box = new([]byte)
		}
		*h.box = h.slab[:0]
		heldSlabs.Put(h.box)
	}
	h.box, h.slab, h.pgs = nil, nil, nil
}

// ReadPages calls fn with each of pgnos (ascending, each one held) in order, as a view's
// ReadPages does.
func (h *heldPages) ReadPages(pgnos []uint32, fn func(pgno uint32, data []byte) error) error {
	if len(h.pgs) == 0 {
		if len(pgnos) > 0 {
			return fmt.Errorf("page %d was not kept", pgnos[0])
		}
		return nil
	}
	size := len(h.slab) / len(h.pgs)
	i := 0
	for _, pg := range pgnos {
		for i < len(h.pgs) && h.pgs[i] < pg {
			i++
		}
		if i == len(h.pgs) || h.pgs[i] != pg {
			return fmt.Errorf("page %d was not kept", pg)
		}
		if err := fn(pg, h.slab[i*size:(i+1)*size]); err != nil {
			return err
		}
	}
	return nil
}

// encodePages writes pages, read by read, as one LTX file of a database of shape sh
// (encodeDelta), on an encoder of the pool (encodeLTX).
func encodePages(sh pageread.Shape, read func([]uint32, func(uint32, []byte) error) error, pages []uint32, minGen, maxGen int64, now time.Time) ([]byte, error) {
	return encodeLTX(func(enc *ltx.Encoder) error { return writePages(enc, sh, read, pages, minGen, maxGen, now) })
}

// writePages is encodePages on the new encoder enc.
func writePages(enc *ltx.Encoder, sh pageread.Shape, read func([]uint32, func(uint32, []byte) error) error, pages []uint32, minGen, maxGen int64, now time.Time) error {
	err := enc.EncodeHeader(ltx.Header{
		Version: ltx.Version, Flags: ltx.HeaderFlagNoChecksum, PageSize: uint32(sh.PageSize),
		Commit: sh.Pages, MinTXID: ltx.TXID(minGen), MaxTXID: ltx.TXID(maxGen), Timestamp: now.UnixMilli(),
	})
	if err != nil {
		return fmt.Errorf("encoding delta: %w", err)
	}
	lock := lockPgno(sh.PageSize)
	want := make([]uint32, 0, len(pages))
	for _, pg := range pages {
		if pg <= sh.Pages && pg != lock {
			want = append(want, pg)
		}
	}
	var encErr error
	err = read(want, func(pg uint32, page []byte) error {
		if err := enc.EncodePage(ltx.PageHeader{Pgno: pg}, page); err != nil {
			encErr = fmt.Errorf("encoding delta: %w", err)
			return encErr
		}
		return nil
	})
	if encErr != nil {
		return encErr
	}
	if err != nil {
		return fmt.Errorf("reading pages: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("encoding delta: %w", err)
	}
	return nil
}

// applyDelta writes an LTX file's pages into out, records their hashes and returns their
// numbers.
func applyDelta(out io.WriterAt, data []byte, img *DBImage, hashes []uint64) ([]uint32, error) {
	dec := ltx.NewDecoder(bytes.NewReader(data))
	if err := dec.DecodeHeader(); err != nil {
		return nil, fmt.Errorf("decoding delta: %w", err)
	}
	if int(dec.Header().PageSize) != img.PageSize {
		return nil, fmt.Errorf("delta has page size %d, image %d", dec.Header().PageSize, img.PageSize)
	}
	page := make([]byte, img.PageSize)
	var pages []uint32
	for {
		var hdr ltx.PageHeader
		err := dec.DecodePage(&hdr, page)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("decoding delta: %w", err)
		}
		if hdr.Pgno > img.Pages {
			continue // beyond the final size: truncated away later
		}
		if _, err := out.WriteAt(page, int64(hdr.Pgno-1)*int64(img.PageSize)); err != nil {
			return nil, err
		}
		hashes[hdr.Pgno-1] = pageHash(hdr.Pgno, page)
		pages = append(pages, hdr.Pgno)
	}
	if err := dec.Close(); err != nil {
		return nil, fmt.Errorf("decoding delta: %w", err)
	}
	return pages, nil
}

// adoptV1 describes a database restored from a format-1 blob as a page image whose base is
// that blob, so the first change to it uploads a delta, not the database.
func adoptV1(p string, f File) *dbState {
	in, err := os.Open(p)
	if err != nil {
		return nil
	}
	hdr := make([]byte, 100)
	_, err = in.ReadAt(hdr, 0)
	in.Close()
	if err != nil || !bytes.HasPrefix(hdr, sqliteHeader) {
		return nil
	}
	ps := int(binary.BigEndian.Uint16(hdr[16:18]))
	if ps == 1 {
		ps = 65536
	}
	if !validPageSize(ps) || f.Size == 0 || f.Size%int64(ps) != 0 {
		return nil
	}
	img := &DBImage{PageSize: ps, Pages: uint32(f.Size / int64(ps)), ChunkBytes: f.Size, Base: f.refs()}
	st, err := hashImage(p, img)
	if err != nil {
		return nil
	}
	img.Checksum = strconv.FormatUint(st.sum, 16)
	st.v1 = &f
	return st
}

func hashImage(p string, img *DBImage) (*dbState, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st := &dbState{img: img, hashes: make([]uint64, img.Pages)}
	buf := make([]byte, max(img.PageSize, 1<<20/img.PageSize*img.PageSize))
	var pg uint32
	for pg < img.Pages {
		n := min(uint32(len(buf)/img.PageSize), img.Pages-pg)
		b := buf[:int(n)*img.PageSize]
		if _, err := io.ReadFull(f, b); err != nil {
			return nil, err
		}
		for j := uint32(0); j < n; j++ {
			h := pageHash(pg+j+1, b[int(j)*img.PageSize:int(j+1)*img.PageSize])
			st.hashes[pg+j] = h
			st.sum ^= h
		}
		pg += n
	}
	return st, nil
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
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
