package spacestore

import (
	"bytes"
	"testing"
)

// FuzzDecodeSegment: a log segment read from the bucket is untrusted. Any bytes either fail
// to decode or decode to a segment that encodes back to the same bytes and whose pages a
// restore can walk; none panics or allocates for data it does not hold.
func FuzzDecodeSegment(f *testing.F) {
	good := shippedSegment(f)
	f.Add(good)
	seal, err := EncodeSegment(&Segment{Gen: 3, Seq: 7, Claim: Claim{Holder: "https://b", Incarnation: "2", Lease: `"x"`}, Seal: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seal)
	f.Add(good[:len(good)/2])
	f.Add([]byte("LCSG\x01\x01"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		seg, err := DecodeSegment(data)
		if err != nil {
			return
		}
		again, err := EncodeSegment(seg)
		if err != nil {
			t.Fatalf("a decoded segment does not encode: %v", err)
		}
		if !bytes.Equal(again, data) {
			t.Fatal("a decoded segment encodes to other bytes")
		}
		for _, d := range seg.DBs {
			err := checkLTX(d, func(pg uint32, page []byte) error {
				if pg < 1 || pg > d.Pages || len(page) != d.PageSize {
					t.Fatalf("page %d of %d bytes in a database of %d pages of %d", pg, len(page), d.Pages, d.PageSize)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("a decoded segment's LTX fails a second walk: %v", err)
			}
		}
	})
}
