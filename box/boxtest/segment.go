package boxtest

import (
	"bytes"
	"testing"

	"github.com/superfly/ltx"

	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/standby"
)

// StreamEntry is an entry of a holder's stream as its shipper cuts it and a standby's
// spool takes it (standby.Spool.Put): segment seq of generation gen under claim, one
// database with one changed page, cut when the bucket log had come to bucketBefore.
func StreamEntry(t testing.TB, gen, seq int64, claim spacestore.Claim, bucketBefore int64) standby.Entry {
	t.Helper()
	const pageSize = 4096
	var buf bytes.Buffer
	enc, err := ltx.NewEncoder(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.EncodeHeader(ltx.Header{Version: ltx.Version, Flags: ltx.HeaderFlagNoChecksum, PageSize: pageSize,
		Commit: 3, MinTXID: ltx.TXID(seq + 1), MaxTXID: ltx.TXID(seq + 1), Timestamp: 1e12}); err != nil {
		t.Fatal(err)
	}
	if err := enc.EncodePage(ltx.PageHeader{Pgno: 2}, make([]byte, pageSize)); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := spacestore.EncodeSegment(&spacestore.Segment{Gen: gen, Seq: seq, Claim: claim,
		DBs: []spacestore.SegmentDB{{Path: "app.db", PageSize: pageSize, Pages: 3, LTX: buf.Bytes()}}})
	if err != nil {
		t.Fatal(err)
	}
	return standby.Entry{BucketBefore: bucketBefore, Data: data}
}
