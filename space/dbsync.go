package space

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/superfly/ltx"
)

// Page-image tuning. A checkpoint uploads one level-0 delta of the pages it changed; when
// deltaFanout deltas of one level end the chain they are merged into one of the next level
// (read from the live database, which holds exactly their newest pages), so a wake reads at
// most (deltaFanout-1)*(maxLevel+1) deltas. The base is rewritten, chunk by chunk and only
// where pages changed, when the top level fills up or when the chain costs a wake more than
// 1/rebaseFraction of the image: its bytes plus objectCost for each object (a GET costs
// about as much time as that many bytes), so a small database is rebased after a few
// checkpoints and a large one keeps its base for hundreds.
const (
	minChunkBytes  = 2 << 20
	maxChunkBytes  = 16 << 20
	deltaFanout    = 8
	maxLevel       = 2
	rebaseFraction = 4
	objectCost     = 128 << 10
	// foldBaseBytes: a final checkpoint (mode Final) folds a chain into the base when the
	// base chunks its pages touch total at most this (a small database: its wake then
	// reads one object, as a whole-file blob did); else into one delta.
	foldBaseBytes = minChunkBytes
	// FoldChain bounds the deltas a wake after a crash reads: once a periodic checkpoint
	// leaves a longer chain, a fold (mode Fold, as Syncer.Fold runs it; the engine runs one
	// right after that checkpoint, in its sync loop, off any request's path) merges its
	// newest deltas until at most foldKeep remain, so folds
	// come every FoldChain-foldKeep+1 checkpoints, not after each one. (Simulated on one
	// row per checkpoint: 6 and 3 fold after about 1 checkpoint in 4, writing fewer pages
	// than the checkpoints themselves; 4 and 2 fold after 1 in 3 and write twice as many.)
	FoldChain = 6
	foldKeep  = 3
	// foldTier: a fold also absorbs an older delta holding at most this many times the
	// pages merged so far, so kept deltas grow geometrically towards the oldest and a page
	// is re-uploaded by folds about log2(chain pages) times, not once per fold.
	foldTier = 2
)

// chainLong reports whether a background fold has work: more than FoldChain deltas.
func (st *dbState) chainLong() bool {
	return st != nil && st.v1 == nil && len(st.img.Deltas) > FoldChain
}

// foldFrom returns the index from which a background fold merges an image's chain into one
// delta: the newest deltas, as many as bring the chain to foldKeep, plus each older one no
// larger than foldTier times what is merged so far (distinct pages stand in for sizes: the
// same hot pages, page 1 and the tree's rightmost leaves, are in every small delta).
func foldFrom(deltaPages [][]uint32) int {
	n := len(deltaPages)
	if n <= FoldChain {
		return n
	}
	i := foldKeep - 1
	merged := make(map[uint32]bool)
	for _, ps := range deltaPages[i:] {
		for _, pg := range ps {
			merged[pg] = true
		}
	}
	for i > 0 && len(deltaPages[i-1]) <= foldTier*len(merged) {
		i--
		for _, pg := range deltaPages[i] {
			merged[pg] = true
		}
	}
	return i
}

// foldable reports whether a final checkpoint has a chain to fold.
func (st *dbState) foldable() bool {
	return st != nil && st.v1 == nil && foldPlan(st.img, st.deltaPages) != foldNone
}

// foldKind is how a final checkpoint folds an image's chain.
type foldKind int

const (
	// foldNone: nothing to gain (no deltas, or one that touches larger chunks).
	foldNone foldKind = iota
	// foldBase: rewrite the base chunks the chain's pages touch, at most foldBaseBytes.
	foldBase
	// foldDelta: merge the chain into one delta.
	foldDelta
)

// foldPlan says how a final checkpoint folds an image's chain.
func foldPlan(img *DBImage, deltaPages [][]uint32) foldKind {
	if len(img.Deltas) == 0 {
		return foldNone
	}
	size := int64(img.Pages) * int64(img.PageSize)
	per := uint32(img.ChunkBytes / int64(img.PageSize))
	if want := chunkBytesFor(size, img.PageSize); want != img.ChunkBytes {
		per = 0 // a rebase re-chunks the whole image
	}
	chunks := make(map[uint32]bool)
	var n int64
	for _, ps := range deltaPages {
		for _, pg := range ps {
			if pg > img.Pages {
				continue
			}
			c := uint32(0)
			if per > 0 {
				c = (pg - 1) / per
			}
			if !chunks[c] {
				chunks[c] = true
				if per == 0 {
					n += size
				} else {
					n += min(img.ChunkBytes, size-int64(c)*img.ChunkBytes)
				}
			}
		}
	}
	if n <= foldBaseBytes {
		return foldBase
	}
	if len(img.Deltas) > 1 {
		return foldDelta
	}
	return foldNone
}

// dbState is what this box knows of one database's last checkpointed image: per-page hashes
// to find changed pages, the WAL position read so far, and the pages each delta holds (to
// merge and rebase without downloading anything).
type dbState struct {
	dev, ino   uint64
	img        *DBImage
	hashes     []uint64 // by pgno-1
	sum        uint64
	wal        walPos
	deltaPages [][]uint32 // parallel to img.Deltas
	// v1 is the format-1 manifest entry of a database restored from a whole-file blob: the
	// image is that blob as a single base chunk, and while nothing changes the entry stays
	// as it was (no manifest write just to migrate).
	v1 *File
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
	var since *walPos
	if prev != nil && prev.wal.Frames > 0 {
		since = &prev.wal
	}
	v, err := openView(ctx, abs, since)
	if err != nil {
		return dbResult{}, err
	}
	defer v.close()
	ch, err := detectChanges(v, prev)
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

// detectChanges finds the pages of the view that differ from prev: from the WAL tail when
// the WAL kept its identity since prev, else by one scan that hashes every page.
func detectChanges(v *dbView, prev *dbState) (dbChanges, error) {
	usable := prev != nil && prev.dev == v.dev && prev.ino == v.ino && prev.img.PageSize == v.pageSize
	if !usable && v.tail {
		if err := v.indexAll(); err != nil {
			return dbChanges{}, err
		}
	}
	ns := &dbState{dev: v.dev, ino: v.ino, wal: v.pos}
	ch := dbChanges{state: ns, usable: usable, pages: v.pages, pageSize: v.pageSize}
	if usable && v.tail {
		ns.hashes = slices.Clone(prev.hashes)
		ns.sum = prev.sum
		for i := int(v.pages); i < len(ns.hashes); i++ {
			ns.sum ^= ns.hashes[i]
		}
		if int(v.pages) < len(ns.hashes) {
			ns.hashes = ns.hashes[:v.pages]
		} else {
			ns.hashes = append(ns.hashes, make([]uint64, int(v.pages)-len(ns.hashes))...)
		}
		page := make([]byte, v.pageSize)
		for _, pg := range v.changedSinceTail() {
			if err := v.readPage(pg, page); err != nil {
				return dbChanges{}, err
			}
			if h := pageHash(pg, page); h != ns.hashes[pg-1] {
				ns.sum ^= ns.hashes[pg-1] ^ h
				ns.hashes[pg-1] = h
				ch.changed = append(ch.changed, pg)
			}
		}
		return ch, nil
	}
	ch.fullScan = true
	ns.hashes = make([]uint64, v.pages)
	err := v.scan(func(pg uint32, data []byte) error {
		h := pageHash(pg, data)
		ns.hashes[pg-1] = h
		ns.sum ^= h
		if !usable || int(pg) > len(prev.hashes) || prev.hashes[pg-1] != h {
			ch.changed = append(ch.changed, pg)
		}
		return nil
	})
	if err != nil {
		return dbChanges{}, fmt.Errorf("reading pages: %w", err)
	}
	return ch, nil
}

// dbStep is how a checkpoint writes one database's image.
type dbStep int

const (
	// stepKeep: the prior image stands as it is (a format-1 entry too); nothing is uploaded.
	stepKeep dbStep = iota
	// stepNewBase: no usable prior image: every base chunk is written.
	stepNewBase
	// stepRebase: the chain is folded into the base: the chunks its pages touch are
	// rewritten (every chunk when the chunk size changes) and the deltas dropped.
	stepRebase
	// stepDeltas: the deltas this checkpoint made (a level-0 delta, merges) are uploaded.
	stepDeltas
)

// dbPlan is what a checkpoint writes for one database: the image its manifest entry will
// be once writeDB fills in the references, and the step that gets there.
type dbPlan struct {
	step       dbStep
	img        *DBImage
	deltaPages [][]uint32 // parallel to img.Deltas
	// fresh holds the indexes of the deltas of img this checkpoint writes (stepDeltas).
	fresh map[int]bool
	// oldBase and dirty are stepRebase's: a chunk of oldBase is kept unless it holds a
	// page of dirty (nil: none is kept unless its content is the same).
	oldBase []Ref
	dirty   map[uint32]bool
}

// planDB decides how a checkpoint in mode writes a database's image, given prev (this
// box's last image of it) and what changed since. It reads and uploads nothing. Unless
// nothing changed (and mode folds nothing) or prev is unusable (a new base), the changed
// pages become a level-0 delta, full levels merge, and the base is rewritten when the top
// level fills or the chain costs a wake too much; else a background fold merges the newest
// deltas of a long chain, and a final checkpoint folds the chain (foldPlan).
func planDB(prev *dbState, ch dbChanges, mode Mode, gen int64) dbPlan {
	if ch.usable && len(ch.changed) == 0 && ch.pages == prev.img.Pages && !mode.refolds(prev) {
		return dbPlan{step: stepKeep, img: prev.img, deltaPages: prev.deltaPages}
	}
	img := &DBImage{PageSize: ch.pageSize, Pages: ch.pages, ChunkBytes: chunkBytesFor(ch.size(), ch.pageSize), Checksum: strconv.FormatUint(ch.state.sum, 16)}
	if !ch.usable {
		return dbPlan{step: stepNewBase, img: img}
	}
	img.ChunkBytes, img.Base = prev.img.ChunkBytes, prev.img.Base
	img.Deltas = slices.Clone(prev.img.Deltas)
	p := dbPlan{step: stepDeltas, img: img, deltaPages: slices.Clone(prev.deltaPages), fresh: map[int]bool{}}
	if len(ch.changed) > 0 || ch.pages != prev.img.Pages { // else only here to fold the chain
		img.Deltas = append(img.Deltas, Delta{Level: 0, MinGen: gen, MaxGen: gen})
		p.deltaPages = append(p.deltaPages, ch.changed)
		p.fresh[len(img.Deltas)-1] = true
	}
	rebase := p.mergeLevels(gen) || p.wakeCost() > ch.size()/rebaseFraction
	if !rebase {
		switch mode {
		case Fold:
			if len(img.Deltas) > FoldChain {
				p.foldNewest(gen)
			}
		case Final:
			rebase = p.foldAll(gen)
		}
	}
	if rebase {
		p.rebase(prev.img.Base, ch.size())
	}
	return p
}

// mergeLevels merges each level's deltas into one of the next level once deltaFanout of
// them end the chain. It reports whether the top level is full: the base must be rewritten.
func (p *dbPlan) mergeLevels(gen int64) bool {
	for level := 0; ; level++ {
		n := 0
		for i := len(p.img.Deltas) - 1; i >= 0 && p.img.Deltas[i].Level == level; i-- {
			n++
		}
		if n < deltaFanout {
			return false
		}
		if level == maxLevel {
			return true
		}
		first := len(p.img.Deltas) - n
		p.mergeTail(first, Delta{Level: level + 1, MinGen: p.img.Deltas[first].MinGen, MaxGen: gen})
	}
}

// wakeCost is what the plan's chain costs a wake, in bytes: the deltas' sizes plus
// objectCost for each. Page counts stand in for the new deltas' compressed sizes: an upper
// bound.
func (p *dbPlan) wakeCost() int64 {
	var total int64
	for i, d := range p.img.Deltas {
		if !p.fresh[i] {
			total += d.Size
		}
	}
	for i := range p.fresh {
		total += int64(len(p.deltaPages[i])) * int64(p.img.PageSize) / 2
	}
	return total + int64(len(p.img.Deltas))*objectCost
}

// foldNewest is a background fold: it merges the newest deltas of the chain (foldFrom).
func (p *dbPlan) foldNewest(gen int64) {
	first := foldFrom(p.deltaPages)
	merged := Delta{MinGen: p.img.Deltas[first].MinGen, MaxGen: gen}
	for _, d := range p.img.Deltas[first:] {
		merged.Level = max(merged.Level, d.Level)
	}
	merged.Level = min(merged.Level+1, maxLevel)
	p.mergeTail(first, merged)
}

// foldAll is a final checkpoint's fold: it merges the chain into one delta, or reports that
// the base must be rewritten instead (foldPlan).
func (p *dbPlan) foldAll(gen int64) (rebase bool) {
	switch foldPlan(p.img, p.deltaPages) {
	case foldBase:
		return true
	case foldDelta:
		var pages []uint32
		for _, ps := range p.deltaPages {
			pages = append(pages, ps...)
		}
		slices.Sort(pages)
		p.img.Deltas = []Delta{{Level: maxLevel, MinGen: p.img.Deltas[0].MinGen, MaxGen: gen}}
		p.deltaPages = [][]uint32{slices.Compact(pages)}
		p.fresh = map[int]bool{0: true}
	}
	return false
}

// rebase turns the plan into rewriting the base chunks of old that the chain's pages touch,
// dropping the chain.
func (p *dbPlan) rebase(old []Ref, size int64) {
	dirty := make(map[uint32]bool)
	for _, ps := range p.deltaPages {
		for _, pg := range ps {
			dirty[pg] = true
		}
	}
	if want := chunkBytesFor(size, p.img.PageSize); p.img.ChunkBytes != want {
		// The database outgrew its chunk size (or is a migrated single-blob base):
		// re-chunk the whole image.
		p.img.ChunkBytes, dirty = want, nil
	}
	p.img.Deltas, p.deltaPages, p.fresh = nil, nil, nil
	p.step, p.oldBase, p.dirty = stepRebase, old, dirty
}

// writeDB uploads what plan p writes, read from the view, and fills in the references of
// p.img.
func (s *Syncer) writeDB(ctx context.Context, v *dbView, p dbPlan, gen int64, now time.Time, up *uploader) error {
	switch p.step {
	case stepNewBase, stepRebase:
		if err := v.indexAll(); err != nil {
			return err
		}
		return s.writeBase(ctx, v, p.img, p.oldBase, p.dirty, gen, up)
	case stepDeltas:
		for i := range p.fresh {
			if len(p.deltaPages[i]) > 0 && p.img.Deltas[i].Level > 0 {
				// A merged delta holds pages older than the WAL's tail.
				if err := v.indexAll(); err != nil {
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

// chunkBytesFor sizes a database's base chunks: about an eighth of the image (one round of
// parallel fetches at a wake), a power of two between minChunkBytes and maxChunkBytes, so
// the size changes only when the database doubles.
func chunkBytesFor(size int64, pageSize int) int64 {
	c := int64(minChunkBytes)
	for c*fetchConcurrency < size && c < maxChunkBytes {
		c *= 2
	}
	return max(c, int64(pageSize))
}

// writeBase sets img.Base to raw page ranges of the view. A chunk whose pages are not in
// dirty and whose extent is unchanged keeps its old object (old[i]); nil dirty rewrites all.
func (s *Syncer) writeBase(ctx context.Context, v *dbView, img *DBImage, old []Ref, dirty map[uint32]bool, gen int64, up *uploader) error {
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
		for j := uint32(0); j < n; j++ {
			if err := v.readPage(first+j, buf[int(j)*img.PageSize:int(j+1)*img.PageSize]); err != nil {
				return fmt.Errorf("reading pages: %w", err)
			}
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
func encodeDelta(v *dbView, pages []uint32, minGen, maxGen int64, now time.Time) ([]byte, error) {
	var buf bytes.Buffer
	enc, err := ltx.NewEncoder(&buf)
	if err != nil {
		return nil, err
	}
	err = enc.EncodeHeader(ltx.Header{
		Version: ltx.Version, Flags: ltx.HeaderFlagNoChecksum, PageSize: uint32(v.pageSize),
		Commit: v.pages, MinTXID: ltx.TXID(minGen), MaxTXID: ltx.TXID(maxGen), Timestamp: now.UnixMilli(),
	})
	if err != nil {
		return nil, fmt.Errorf("encoding delta: %w", err)
	}
	page := make([]byte, v.pageSize)
	lock := lockPgno(v.pageSize)
	for _, pg := range pages {
		if pg > v.pages || pg == lock {
			continue
		}
		if err := v.readPage(pg, page); err != nil {
			return nil, fmt.Errorf("reading pages: %w", err)
		}
		if err := enc.EncodePage(ltx.PageHeader{Pgno: pg}, page); err != nil {
			return nil, fmt.Errorf("encoding delta: %w", err)
		}
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encoding delta: %w", err)
	}
	return buf.Bytes(), nil
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

// mergeTail replaces the plan's deltas from first on by merged, which holds their pages, and
// marks it as written by this checkpoint (fresh).
func (p *dbPlan) mergeTail(first int, merged Delta) {
	var pages []uint32
	for _, ps := range p.deltaPages[first:] {
		pages = append(pages, ps...)
	}
	slices.Sort(pages)
	p.img.Deltas = append(p.img.Deltas[:first], merged)
	p.deltaPages = append(p.deltaPages[:first], slices.Compact(pages))
	for i := range p.fresh {
		if i >= first {
			delete(p.fresh, i)
		}
	}
	p.fresh[first] = true
}
