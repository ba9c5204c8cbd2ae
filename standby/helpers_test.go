package standby

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/superfly/ltx"

	"github.com/lchat/lchat-caddy/spacestore"
)

// claimA and claimB are two holders' lease acquisitions.
var (
	claimA = spacestore.Claim{Holder: "https://a.test", Incarnation: "1", Lease: `"la"`, At: time.Unix(1e9, 0).UTC()}
	claimB = spacestore.Claim{Holder: "https://b.test", Incarnation: "7", Lease: `"lb"`, At: time.Unix(2e9, 0).UTC()}
)

// segment returns a real encoded data segment (one database, one changed page, the LTX
// file as a holder's shipper writes it) of seq in gen by claim; fill varies the page's
// bytes so two segments at one seq can differ.
func segment(t testing.TB, gen, seq int64, claim spacestore.Claim, fill byte) []byte {
	t.Helper()
	const pageSize = 4096
	var buf bytes.Buffer
	enc, err := ltx.NewEncoder(&buf)
	if err != nil {
		t.Fatal(err)
	}
	err = enc.EncodeHeader(ltx.Header{
		Version: ltx.Version, Flags: ltx.HeaderFlagNoChecksum, PageSize: pageSize,
		Commit: 3, MinTXID: ltx.TXID(seq + 1), MaxTXID: ltx.TXID(seq + 1), Timestamp: 1e12,
	})
	if err != nil {
		t.Fatal(err)
	}
	page := bytes.Repeat([]byte{fill}, pageSize)
	copy(page, fmt.Sprintf("gen %d seq %d", gen, seq))
	if err := enc.EncodePage(ltx.PageHeader{Pgno: 2}, page); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := spacestore.EncodeSegment(&spacestore.Segment{
		Gen: gen, Seq: seq, Claim: claim,
		DBs: []spacestore.SegmentDB{{Path: "app.db", PageSize: pageSize, Pages: 3, LTX: buf.Bytes()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spacestore.DecodeSegment(data); err != nil {
		t.Fatalf("the test's segment does not decode: %v", err)
	}
	return data
}

// entry is segment with a BucketBefore.
func entry(t testing.TB, gen, seq int64, claim spacestore.Claim, bb int64) Entry {
	return Entry{BucketBefore: bb, Data: segment(t, gen, seq, claim, 'x')}
}

// openSpool opens a spool in dir and closes it with the test.
func openSpool(t testing.TB, dir string) *Spool {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// mustPut puts each entry and fails the test on an error.
func mustPut(t testing.TB, s *Spool, host string, ents ...Entry) {
	t.Helper()
	for _, e := range ents {
		if err := s.Put(host, e); err != nil {
			t.Fatal(err)
		}
	}
}

// wantErr fails unless errors.Is(err, want) (want nil: err nil).
func wantErr(t testing.TB, what string, err, want error) {
	t.Helper()
	if want == nil && err != nil || want != nil && !errors.Is(err, want) {
		t.Fatalf("%s = %v, want %v", what, err, want)
	}
}

// sameEntries fails unless got holds want's entries, in order.
func sameEntries(t testing.TB, got, want []Entry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d entries, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].BucketBefore != want[i].BucketBefore || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Fatalf("entry %d differs (BucketBefore %d, want %d)", i+1, got[i].BucketBefore, want[i].BucketBefore)
		}
	}
}

// hostStatus returns host's status line (ok false: none).
func hostStatus(s *Spool, host string) (HostStatus, bool) {
	for _, st := range s.Status() {
		if st.Host == host {
			return st, true
		}
	}
	return HostStatus{}, false
}
