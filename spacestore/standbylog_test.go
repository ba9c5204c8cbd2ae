package spacestore

import (
	"context"
	"errors"
	"testing"

	"github.com/lchat/lchat-caddy/bucket/membucket"
)

// TestStandbyRecordLateWriteLoses: a holder paused with its record write in flight cannot
// land it over the record of the holder that took the space over since: its write is
// conditioned on the record it read, which is no longer there; a retry of a write that did
// land is recognized.
func TestStandbyRecordLateWriteLoses(t *testing.T) {
	ctx := context.Background()
	b := membucket.New()
	const host = "rec.example.com"
	old := StandbyRecord{Gen: 3, BaseSeq: 1, Claim: Claim{Holder: "a", Incarnation: "1", Lease: "l1"}, Box: "b"}
	etagOld, err := WriteStandbyRecord(ctx, b, host, old, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteStandbyRecord(ctx, b, host, old, ""); err != nil {
		t.Fatalf("the same first write retried: %v", err)
	}
	// The new holder reads the record and writes its own over it.
	_, etag, err := ReadStandbyRecord(ctx, b, host)
	if err != nil || etag != etagOld {
		t.Fatalf("read %q %v, want %q", etag, err, etagOld)
	}
	newer := StandbyRecord{Gen: 3, BaseSeq: 5, Claim: Claim{Holder: "c", Incarnation: "2", Lease: "l2"}, Box: "a"}
	if _, err := WriteStandbyRecord(ctx, b, host, newer, etag); err != nil {
		t.Fatal(err)
	}
	// The old holder resumes: its next write, on the ETag it knew, loses.
	stale := old
	stale.Gen = 4
	if _, err := WriteStandbyRecord(ctx, b, host, stale, etagOld); !errors.Is(err, ErrStandbyRecordMoved) {
		t.Fatalf("the late write: %v, want ErrStandbyRecordMoved", err)
	}
	got, _, err := ReadStandbyRecord(ctx, b, host)
	if err != nil || got == nil || got.Claim.Holder != "c" || got.BaseSeq != 5 {
		t.Fatalf("the record after the late write: %+v %v, want the new holder's", got, err)
	}
	if r, etag, err := ReadStandbyRecord(ctx, b, "none.example.com"); r != nil || etag != "" || err != nil {
		t.Fatalf("no record: %+v %q %v", r, etag, err)
	}
}
