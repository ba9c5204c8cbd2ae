package spacestore

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/spacestore/pageread"
)

// recordingKeeper is a viewKeeper that notes, per view, what the shipper did with it.
type recordingKeeper struct {
	viewKeeper
	views []*recordingView
}

func (k *recordingKeeper) Open(ctx context.Context, abs string, since *pageread.WALPos) (pageread.Source, error) {
	v, err := k.viewKeeper.Open(ctx, abs, since)
	if err != nil {
		return nil, err
	}
	r := &recordingView{Source: v}
	k.views = append(k.views, r)
	return r, nil
}

type recordingView struct {
	pageread.Source
	calls       []string
	readsClosed int // ReadPages or Scan calls after Close
	closed      bool
}

func (v *recordingView) note(call string) {
	v.calls = append(v.calls, call)
	if v.closed {
		v.readsClosed++
	}
}

func (v *recordingView) ReadPages(pgnos []uint32, fn func(uint32, []byte) error) error {
	v.note("ReadPages")
	return v.Source.ReadPages(pgnos, fn)
}

func (v *recordingView) Scan(fn func(uint32, []byte) error) error {
	v.note("Scan")
	return v.Source.Scan(fn)
}

func (v *recordingView) Close() error {
	if !v.closed {
		v.calls = append(v.calls, "Close")
	}
	v.closed = true
	return v.Source.Close()
}

// TestLogShipperLetsTheLockGoBeforeEncoding: a cut reads the changed pages under the view
// (the database's write lock) once and ends the view before it encodes the segment, so the
// instance's writers wait for the read only; a change larger than the shipper holds is
// encoded from the view, under the lock, as before. Both ways cut the same segment.
func TestLogShipperLetsTheLockGoBeforeEncoding(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "app.db")
	db := openDB(t, p)
	fillDB(t, db, 200, 300)
	claim := Claim{Holder: "https://a", Incarnation: "1", Lease: `"l"`, At: time.Unix(1e9, 0)}

	// Two shippers from the same (empty) base, one holding the pages, one not.
	held := testShipper(t, dir, nil, nil, 1, 1, claim)
	over := testShipper(t, dir, nil, nil, 1, 1, claim)
	over.holdLimit = 1
	rec := map[*LogShipper]*recordingKeeper{}
	for _, l := range []*LogShipper{held, over} {
		if l.keep == nil { // freshLogViews: each view on its own connection
			l.keep = inProcess{pageread.NewKeeper()}
		}
		rec[l] = &recordingKeeper{viewKeeper: l.keep}
		l.keep = rec[l]
	}
	now := settled()
	for _, step := range []string{"first cut: every page, by a scan", "a WAL tail"} {
		if step == "a WAL tail" {
			fillDB(t, db, 20, 300)
			now = settled()
		}
		a, err := held.Next(context.Background(), now)
		if err != nil || a == nil {
			t.Fatalf("%s: held Next = %v, %v", step, a, err)
		}
		b, err := over.Next(context.Background(), now)
		if err != nil || b == nil {
			t.Fatalf("%s: over Next = %v, %v", step, b, err)
		}
		if len(a.DBs) != 1 || len(b.DBs) != 1 || !bytes.Equal(a.DBs[0].LTX, b.DBs[0].LTX) {
			t.Fatalf("%s: the held pages' segment differs from the view's", step)
		}
		hv := rec[held].views[len(rec[held].views)-1]
		if hv.readsClosed != 0 || len(hv.calls) != 2 || hv.calls[1] != "Close" {
			t.Errorf("%s: holding shipper's view saw %v (reads after Close: %d), want one read, then Close", step, hv.calls, hv.readsClosed)
		}
		ov := rec[over].views[len(rec[over].views)-1]
		if len(ov.calls) != 3 || ov.calls[1] != "ReadPages" || ov.calls[2] != "Close" {
			t.Errorf("%s: over-the-limit shipper's view saw %v, want a read, the encoding's ReadPages, then Close", step, ov.calls)
		}
	}
}

func TestHeldPagesReadsBackWhatItKept(t *testing.T) {
	h := &heldPages{limit: 3 * 4}
	h.add(2, []byte("bbbb"))
	h.add(5, []byte("eeee"))
	h.add(9, []byte("iiii"))
	var got []string
	err := h.ReadPages([]uint32{2, 9}, func(pg uint32, data []byte) error {
		got = append(got, string(data))
		return nil
	})
	if err != nil || len(got) != 2 || got[0] != "bbbb" || got[1] != "iiii" {
		t.Fatalf("ReadPages(2, 9) = %q, %v", got, err)
	}
	if err := h.ReadPages([]uint32{3}, func(uint32, []byte) error { return nil }); err == nil {
		t.Fatal("ReadPages of a page not kept: no error")
	}
	h.add(10, []byte("j"))
	if !h.over || h.slab != nil {
		t.Fatalf("past its limit: over %v, %d bytes kept", h.over, len(h.slab))
	}
}
