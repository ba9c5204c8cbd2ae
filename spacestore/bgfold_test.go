package spacestore

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestFoldBoundsTheChainAfterACrash: periodic checkpoints each followed by Fold (as the
// engine runs them) never leave a chain longer than FoldChain, so a wake after a crash
// reads a bounded number of deltas; the restore is exact; and a fold with nothing to do
// writes nothing.
func TestFoldBoundsTheChainAfterACrash(t *testing.T) {
	ctx := context.Background()
	b := backends["file"](t)
	s, db := chainDB(t, b, 6000, 0) // ~6 MB: several base chunks
	var ckptPages, foldPages int
	const n = 40
	for i := range n {
		fillDB(t, db, 1, 1000)
		st, err := s.Checkpoint(ctx, Periodic, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		ckptPages += st.PagesChanged
		if !s.FoldDue() {
			continue
		}
		before := len(s.manifest.Files[0].Content.DB.Deltas)
		fs, err := s.Fold(ctx, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		img := s.manifest.Files[0].Content.DB
		if !fs.ManifestWritten || len(img.Deltas) > FoldChain || s.FoldDue() {
			t.Fatalf("checkpoint %d: fold of %d deltas wrote manifest %v and left %d (FoldDue %v), want <= %d",
				i, before, fs.ManifestWritten, len(img.Deltas), s.FoldDue(), FoldChain)
		}
		for _, d := range img.Deltas {
			if d.Size > 0 && d.MaxGen == s.manifest.Generation {
				foldPages += int(d.Size) // bytes of the merged delta, compared below
			}
		}
	}
	if got := len(s.manifest.Files[0].Content.DB.Deltas); got > FoldChain+1 {
		t.Fatalf("after %d checkpoints the chain holds %d deltas, want <= %d", n, got, FoldChain+1)
	}
	// Without folds the chain of 40 one-row checkpoints holds 7 + 4 = 11 deltas.
	if fs, err := s.Fold(ctx, time.Now()); err != nil || (fs.ManifestWritten && len(s.manifest.Files[0].Content.DB.Deltas) > FoldChain) {
		t.Fatalf("fold: %v, %+v", err, fs)
	}
	gen := s.manifest.Generation
	if fs, err := s.Fold(ctx, time.Now()); err != nil || fs.ManifestWritten || s.manifest.Generation != gen {
		t.Fatalf("a fold with a short chain wrote: %+v, err %v", fs, err)
	}
	r := restoreInto(t, b)
	if got := rows(t, filepath.Join(r.DataDir, "app.db")); got != 6000+1+n {
		t.Fatalf("restored %d rows, want %d", got, 6000+1+n)
	}
	t.Logf("%d checkpoints changed %d pages; folds wrote %d B of merged deltas", n, ckptPages, foldPages)
}

// TestFoldKeepsLargeOldDeltas: a fold merges the newest deltas and keeps an older one much
// larger than them (size-tiered), so a page is not re-uploaded by every fold; it merges as
// many as it takes to leave foldKeep, so the next fold is a few checkpoints away.
func TestFoldKeepsLargeOldDeltas(t *testing.T) {
	next := uint32(1000)
	fresh := func(n int) []uint32 { // n pages no other delta holds
		out := make([]uint32, n)
		for i := range out {
			next++
			out[i] = next
		}
		return out
	}
	hot := func() []uint32 { return []uint32{1, 2} } // in every small delta
	for _, tc := range []struct {
		name  string
		chain [][]uint32
		want  int
	}{
		{"short chain: nothing to merge", [][]uint32{fresh(2), fresh(2), fresh(2)}, 3},
		{"the large old delta stays", [][]uint32{fresh(300), fresh(10), fresh(2), fresh(2), fresh(2), fresh(2), fresh(2)}, 1},
		{"tiers stay", [][]uint32{fresh(300), fresh(120), fresh(40), fresh(2), fresh(2), fresh(2), fresh(2)}, 2},
		{"similar sizes merge into one", [][]uint32{fresh(5), fresh(4), fresh(3), fresh(2), fresh(2), fresh(2), fresh(2)}, 0},
		// Five deltas of the same two hot pages merge into two pages, not ten: the older
		// delta of 20 pages stays.
		{"distinct pages count", [][]uint32{fresh(300), fresh(20), hot(), hot(), hot(), hot(), hot()}, 2},
	} {
		if got := foldFrom(tc.chain); got != tc.want {
			t.Errorf("%s: foldFrom = %d, want %d", tc.name, got, tc.want)
		}
	}
}
