package spacestore

import (
	"bytes"
	"encoding/hex"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/superfly/ltx"

	"github.com/lchat/lchat-caddy/spacestore/pageread"
)

// TestLTXEncoderReuse: an encoder started afresh by copying (ltxEncoder) writes, file after
// file, the bytes a new ltx.Encoder writes, after a file it gave up halfway too; each file,
// in a segment, decodes (DecodeSegment: its checksum, its pages in place) to exactly the
// pages it was given.
func TestLTXEncoderReuse(t *testing.T) {
	const pageSize = 4096
	rng := rand.New(rand.NewPCG(3, 4))
	type file struct {
		pages  map[uint32][]byte
		commit uint32
	}
	mk := func(commit uint32, pgs ...uint32) file {
		f := file{pages: make(map[uint32][]byte), commit: commit}
		for i, pg := range pgs {
			data := make([]byte, pageSize)
			for j := range data {
				if i%2 == 0 {
					data[j] = byte(rng.Uint32()) // incompressible
				} else {
					data[j] = byte(j%61) ^ byte(pg) // compresses
				}
			}
			data[rng.IntN(pageSize)] = byte(rng.Uint32())
			f.pages[pg] = data
		}
		return f
	}
	var many []uint32 // more pages than the encoder's first page index chunk holds (256)
	for pg := uint32(10); pg < 310; pg++ {
		many = append(many, pg)
	}
	files := []file{mk(40, 1, 2, 7, 33), mk(9, 3, 9), mk(40, 1, 2, 7, 33), mk(400, many...), mk(2, 2)}
	now := time.UnixMilli(1_700_000_000_000)
	e, err := newLTXEncoder()
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range files {
		sh := pageread.Shape{PageSize: pageSize, Pages: f.commit}
		pgs := slices.Sorted(maps.Keys(f.pages))
		read := func(pgnos []uint32, fn func(uint32, []byte) error) error {
			for _, pg := range pgnos {
				if err := fn(pg, f.pages[pg]); err != nil {
					return err
				}
			}
			return nil
		}
		txid := int64(i + 2)
		write := func(enc *ltx.Encoder) error { return writePages(enc, sh, read, pgs, txid, txid, now) }
		got, err := e.encode(write)
		if err != nil {
			t.Fatalf("file %d: %v", i, err)
		}
		var want bytes.Buffer
		enc, err := ltx.NewEncoder(&want)
		if err != nil {
			t.Fatal(err)
		}
		if err := write(enc); err != nil {
			t.Fatalf("file %d, new encoder: %v", i, err)
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("file %d: the reused encoder wrote %d bytes, a new one %d, not the same", i, len(got), want.Len())
		}
		data, err := EncodeSegment(&Segment{Gen: 1, Seq: int64(i + 1), DBs: []SegmentDB{{Path: "app.db", PageSize: pageSize, Pages: f.commit, LTX: got}}})
		if err != nil {
			t.Fatal(err)
		}
		seg, err := DecodeSegment(data)
		if err != nil {
			t.Fatalf("file %d: %v", i, err)
		}
		decoded := make(map[uint32][]byte)
		err = checkLTX(seg.DBs[0], func(pg uint32, page []byte) error {
			decoded[pg] = bytes.Clone(page)
			return nil
		})
		if err != nil || !maps.EqualFunc(decoded, f.pages, bytes.Equal) {
			t.Fatalf("file %d decodes to pages %v (%v), want %v", i, slices.Sorted(maps.Keys(decoded)), err, pgs)
		}

		// A file given up after its first page leaves nothing to the next.
		broken := errors.New("broken read")
		_, err = e.encode(func(enc *ltx.Encoder) error {
			return writePages(enc, sh, func(pgnos []uint32, fn func(uint32, []byte) error) error {
				if err := fn(pgnos[0], f.pages[pgnos[0]]); err != nil {
					return err
				}
				return broken
			}, pgs, txid, txid, now)
		})
		if !errors.Is(err, broken) {
			t.Fatalf("file %d given up: %v", i, err)
		}
	}
}

// TestEncodeSegmentBytes: the encoding of a segment, byte for byte as version 1 has
// written it: a standby or a restore reads what another version of the box wrote.
func TestEncodeSegmentBytes(t *testing.T) {
	for _, c := range []struct {
		seg  *Segment
		want string
	}{
		{&Segment{Gen: 3, Seq: 258, Claim: Claim{Holder: "https://a", Incarnation: "1", Lease: `"l"`, At: time.Unix(1e9, 5)},
			DBs: []SegmentDB{{Path: "app.db", PageSize: 4096, Pages: 70000, LTX: []byte("ltx-one")}, {Path: "sub/b.db", PageSize: 512, Pages: 3, LTX: []byte("two")}}},
			"4c435347010100000000000000030000000000000102000968747470733a2f2f610001310003226c220de0b6b3a76400050000000200066170702e64620000100000011170000000076c74782d6f6e6500087375622f622e646200000200000000030000000374776f"},
		{&Segment{Gen: 0, Seq: 1, Claim: Claim{Holder: "https://b"}, Seal: true},
			"4c435347010200000000000000000000000000000001000968747470733a2f2f6200000000000000000000000000000000"},
	} {
		got, err := EncodeSegment(c.seg)
		if err != nil {
			t.Fatal(err)
		}
		if h := hex.EncodeToString(got); h != c.want {
			t.Errorf("EncodeSegment(seq %d) = %s, want %s", c.seg.Seq, h, c.want)
		}
	}
}
