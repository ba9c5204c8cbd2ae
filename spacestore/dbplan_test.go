package spacestore

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestPlanDB: how a checkpoint writes a database's image, per mode and chain, decided
// without reading or uploading anything, and without touching the prior state.
func TestPlanDB(t *testing.T) {
	const ps = 4096
	const small, large = 256, 6144 // pages: 1 MiB (one 2 MiB chunk), 24 MiB (4 MiB chunks)
	// prev is an image of pages pages whose chain has deltas of the given levels, each of
	// deltaSize bytes holding one page (2, 3, ...), so the chain touches one base chunk.
	prev := func(pages uint32, chunkBytes, deltaSize int64, levels ...int) *dbState {
		img := &DBImage{PageSize: ps, Pages: pages, ChunkBytes: chunkBytes, Checksum: "1"}
		for c := int64(0); c*chunkBytes < int64(pages)*ps; c++ {
			img.Base = append(img.Base, Ref{Key: "base", Size: chunkBytes})
		}
		st := &dbState{img: img, hashes: make([]uint64, pages)}
		for i, l := range levels {
			img.Deltas = append(img.Deltas, Delta{Level: l, MinGen: int64(i + 2), MaxGen: int64(i + 2), Ref: Ref{Key: "delta", Size: deltaSize}})
			st.deltaPages = append(st.deltaPages, []uint32{uint32(i + 2)})
		}
		return st
	}
	rep := func(l, n int) []int { return slices.Repeat([]int{l}, n) }
	// wide gives the first n deltas of st 50 pages each.
	wide := func(st *dbState, n int) *dbState {
		for i := range n {
			st.deltaPages[i] = nil
			for pg := range uint32(50) {
				st.deltaPages[i] = append(st.deltaPages[i], 100+uint32(i)*50+pg)
			}
		}
		return st
	}
	const gen = 100
	for _, tc := range []struct {
		name    string
		prev    *dbState // nil: no usable prior image
		changed []uint32
		pages   uint32 // 0: prev's
		mode    Mode
		step    dbStep
		levels  []int // of the planned chain
		fresh   []int // deltas this checkpoint writes
		chunk   int64 // of the planned image; 0: prev's
		allBase bool  // stepRebase rewrites every chunk
	}{
		{name: "nothing changed", prev: prev(large, 4<<20, ps, 0, 0), step: stepKeep, levels: []int{0, 0}},
		{name: "no prior image", changed: []uint32{1, 2}, pages: small, step: stepNewBase, chunk: 2 << 20},
		{name: "one page", prev: prev(large, 4<<20, ps, 0, 0), changed: []uint32{9}, step: stepDeltas, levels: []int{0, 0, 0}, fresh: []int{2}},
		{name: "grown, no page changed", prev: prev(large, 4<<20, ps, 0), pages: large + 1, step: stepDeltas, levels: []int{0, 0}, fresh: []int{1}},
		{name: "level 0 full", prev: prev(large, 4<<20, ps, rep(0, deltaFanout-1)...), changed: []uint32{9}, step: stepDeltas, levels: []int{1}, fresh: []int{0}},
		{name: "levels 0 and 1 full", prev: prev(large, 4<<20, ps, append(rep(1, deltaFanout-1), rep(0, deltaFanout-1)...)...), changed: []uint32{9}, step: stepDeltas, levels: []int{2}, fresh: []int{0}},
		{name: "top level full", prev: prev(large, 4<<20, ps, append(append(rep(2, deltaFanout-1), rep(1, deltaFanout-1)...), rep(0, deltaFanout-1)...)...), changed: []uint32{9}, step: stepRebase},
		{name: "chain costs a wake too much", prev: prev(large, 4<<20, 3<<20, 0, 0), changed: []uint32{9}, step: stepRebase},
		{name: "outgrew its chunk size", prev: prev(large, 2<<20, 3<<20, 0, 0), changed: []uint32{9}, step: stepRebase, chunk: 4 << 20, allBase: true},
		{name: "final, small database", prev: prev(small, 2<<20, ps, 0), mode: Final, step: stepRebase},
		{name: "final, large database", prev: prev(large, 4<<20, ps, 0, 1, 0), mode: Final, step: stepDeltas, levels: []int{maxLevel}, fresh: []int{0}},
		{name: "final, large database, with a change", prev: prev(large, 4<<20, ps, 0), changed: []uint32{9}, mode: Final, step: stepDeltas, levels: []int{maxLevel}, fresh: []int{0}},
		{name: "final, one delta over a large chunk", prev: prev(large, 4<<20, ps, 0), mode: Final, step: stepKeep, levels: []int{0}},
		{name: "final, no chain", prev: prev(large, 4<<20, ps), mode: Final, step: stepKeep},
		{name: "fold, short chain", prev: prev(large, 4<<20, ps, rep(0, FoldChain)...), mode: Fold, step: stepKeep, levels: rep(0, FoldChain)},
		{name: "fold, a change that makes the chain FoldChain long", prev: prev(large, 4<<20, ps, rep(0, FoldChain-1)...), changed: []uint32{9}, mode: Fold, step: stepDeltas, levels: rep(0, FoldChain), fresh: []int{FoldChain - 1}},
		{name: "fold, long chain", prev: prev(large, 4<<20, ps, rep(0, FoldChain+1)...), mode: Fold, step: stepDeltas, levels: []int{1}, fresh: []int{0}},
		{name: "fold, long chain behind wide deltas", prev: wide(prev(large, 4<<20, ps, rep(0, FoldChain+1)...), 2), mode: Fold, step: stepDeltas, levels: []int{0, 0, 1}, fresh: []int{2}},
		{name: "periodic, long chain", prev: prev(large, 4<<20, ps, rep(0, FoldChain+1)...), step: stepKeep, levels: rep(0, FoldChain+1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pages := tc.pages
			if pages == 0 {
				pages = tc.prev.img.Pages
			}
			ch := dbChanges{state: &dbState{sum: 7}, usable: tc.prev != nil, changed: tc.changed, pages: pages, pageSize: ps}
			var before []byte
			if tc.prev != nil {
				before, _ = json.Marshal([]any{tc.prev.img, tc.prev.deltaPages})
			}
			p := planDB(tc.prev, ch, tc.mode, gen)
			if tc.prev != nil {
				if after, _ := json.Marshal([]any{tc.prev.img, tc.prev.deltaPages}); string(after) != string(before) {
					t.Fatalf("planDB changed the prior state:\n%s\n%s", before, after)
				}
			}
			var levels []int
			for _, d := range p.img.Deltas {
				levels = append(levels, d.Level)
			}
			var fresh []int
			for i := range p.fresh {
				fresh = append(fresh, i)
			}
			slices.Sort(fresh)
			if p.step != tc.step || !slices.Equal(levels, tc.levels) || !slices.Equal(fresh, tc.fresh) {
				t.Fatalf("plan: step %d, levels %v, fresh %v; want step %d, levels %v, fresh %v", p.step, levels, fresh, tc.step, tc.levels, tc.fresh)
			}
			if len(p.deltaPages) != len(p.img.Deltas) {
				t.Fatalf("%d delta page lists for %d deltas", len(p.deltaPages), len(p.img.Deltas))
			}
			for _, i := range fresh {
				if d := p.img.Deltas[i]; d.MaxGen != gen || d.Ref != (Ref{}) {
					t.Fatalf("fresh delta %d = %+v, want MaxGen %d and no reference yet", i, d, gen)
				}
			}
			want := tc.chunk
			if want == 0 {
				want = tc.prev.img.ChunkBytes
			}
			if p.img.ChunkBytes != want || p.img.Pages != pages {
				t.Fatalf("image of %d pages in %d-byte chunks, want %d pages in %d", p.img.Pages, p.img.ChunkBytes, pages, want)
			}
			if p.step == stepRebase && ((p.dirty == nil) != tc.allBase || !slices.Equal(p.oldBase, tc.prev.img.Base)) {
				t.Fatalf("rebase: dirty %v over %d old chunks, want every chunk rewritten %v", p.dirty, len(p.oldBase), tc.allBase)
			}
		})
	}
}
