package spacestore

import (
	"slices"
	"strconv"
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
