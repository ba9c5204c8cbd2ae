package spacestore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/superfly/ltx"

	"github.com/lchat/lchat-caddy/bucket"
)

// A holder of a space whose kind's durability is "standby" streams each segment it cuts to
// its standby box before it acknowledges what the segment carries (the engine's
// standby.go). That stream is a second log beside the bucket's: its own seqs from 1, cut from
// its own base (StandbyRecord.BaseSeq) by its own LogShipper. A takeover seals the stream on
// the standby and, when it is newer than the bucket log, writes what it adds to the bucket
// log as one segment (FixupSegment) before it seals the bucket log, so the bucket log alone
// describes the state from then on.

// StandbyKey is the key of a space's standby record.
func StandbyKey(host string) string { return "spaces/" + host + "/standby" }

// StandbyRecord names where a holder streams its log, for a takeover to find it: written
// before the first segment of each stream is sent.
type StandbyRecord struct {
	// Gen is the generation whose log the stream extends.
	Gen int64 `json:"gen"`
	// BaseSeq is the seq of the bucket log's segment whose state the stream's first segment
	// builds on: the holder's seal at its wake, or 0 for a stream that starts with a
	// generation (on the checkpoint's state).
	BaseSeq int64 `json:"base_seq"`
	// Claim is the holder's: the stream's segments carry it.
	Claim Claim `json:"claim"`
	// Box is the standby's member name.
	Box string `json:"box"`
	// GivenUp is set by the holder once it gave the standby up and a bucket proof cut after
	// that landed: the bucket log then holds everything the stream carried, so a takeover
	// that cannot reach the standby goes on without it and loses nothing.
	GivenUp bool `json:"given_up,omitempty"`
}

// WriteStandbyRecord writes host's standby record over the one at etag ("" when there was
// none: If-None-Match) and returns its new ETag. Every holder writes it conditioned on the
// record it last read or wrote, so a holder paused with a write in flight cannot land it
// over a newer holder's record once that one was written: the late write fails, or lands
// first and the newer holder's fails, reads again and writes over it. ErrStandbyRecordMoved
// means the record changed since etag: read it again (ReadStandbyRecord) and retry.
func WriteStandbyRecord(ctx context.Context, b bucket.Bucket, host string, r StandbyRecord, etag string) (string, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return "", err
	}
	cond := bucket.Cond{IfMatch: etag, IfNoneMatch: etag == ""}
	info, err := b.Put(ctx, StandbyKey(host), bytes.NewReader(data), int64(len(data)), cond)
	if bucket.LostRace(err) {
		if tag, _, ok := bucket.Landed(ctx, b, StandbyKey(host), data); ok {
			return tag, nil
		}
		return "", ErrStandbyRecordMoved
	}
	if err != nil {
		return "", fmt.Errorf("writing the standby record: %w", err)
	}
	return info.ETag, nil
}

// ErrStandbyRecordMoved is WriteStandbyRecord's lost condition.
var ErrStandbyRecordMoved = errors.New("the standby record changed since it was read")

// ReadStandbyRecord reads host's standby record and its ETag; nil and "" when there is none.
func ReadStandbyRecord(ctx context.Context, b bucket.Bucket, host string) (*StandbyRecord, string, error) {
	var r StandbyRecord
	etag, err := getJSON(ctx, b, StandbyKey(host), &r)
	if err != nil {
		if errors.Is(err, bucket.ErrNotFound) {
			return nil, "", nil
		}
		return nil, "", fmt.Errorf("reading the standby record: %w", err)
	}
	return &r, etag, nil
}

// SameClaim reports whether two claims name the same lease acquisition.
func SameClaim(a, b Claim) bool { return sameClaim(a, b) }

// SegmentPages adds to pages, by database path, the pages seg carries (checked whole, as
// ApplySegments checks them).
func SegmentPages(seg *Segment, pages map[string]map[uint32]bool) error {
	for _, d := range seg.DBs {
		set := pages[d.Path]
		if set == nil {
			set = make(map[uint32]bool)
			pages[d.Path] = set
		}
		if err := checkLTX(d, func(pg uint32, _ []byte) error { set[pg] = true; return nil }); err != nil {
			return fmt.Errorf("segment %d: %s: %w", seg.Seq, d.Path, err)
		}
	}
	return nil
}

// FixupSegment is the segment (gen, seq, claim) that carries, for each database of pages,
// those pages as the data dir holds them now, and its size: applied to any state that
// differs from the data dir's only in those pages and the size, it gives the data dir's. The
// databases must have no WAL (a restored data dir before its instance starts). A database
// the data dir no longer holds, or pages past its end, are left out.
func FixupSegment(dataDir string, pages map[string]map[uint32]bool, gen, seq int64, claim Claim, now time.Time) (*Segment, error) {
	seg := &Segment{Gen: gen, Seq: seq, Claim: claim}
	for _, rel := range slices.Sorted(maps.Keys(pages)) {
		d, err := fixupDB(dataDir, rel, pages[rel], seq, now)
		if err != nil {
			return nil, fmt.Errorf("fixup segment: %s: %w", rel, err)
		}
		if d != nil {
			seg.DBs = append(seg.DBs, *d)
		}
	}
	if err := seg.check(); err != nil {
		return nil, fmt.Errorf("fixup segment: %w", err)
	}
	return seg, nil
}

func fixupDB(dataDir, rel string, set map[uint32]bool, seq int64, now time.Time) (*SegmentDB, error) {
	abs := filepath.Join(dataDir, filepath.FromSlash(rel))
	if fi, err := os.Lstat(abs + "-wal"); err == nil && fi.Size() > 0 {
		return nil, errors.New("the database has a WAL")
	}
	f, err := os.OpenFile(abs, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var hdr [100]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return nil, fmt.Errorf("reading the header: %w", err)
	}
	pageSize := int(hdr[16])<<8 | int(hdr[17])
	if pageSize == 1 {
		pageSize = 65536
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if pageSize < 512 || fi.Size()%int64(pageSize) != 0 {
		return nil, fmt.Errorf("a file of %d bytes with pages of %d", fi.Size(), pageSize)
	}
	npages := uint32(fi.Size() / int64(pageSize))
	var buf bytes.Buffer
	enc, err := ltx.NewEncoder(&buf)
	if err != nil {
		return nil, err
	}
	// LTX transaction ids start at 2: an LTX file starting at 1 is a snapshot.
	err = enc.EncodeHeader(ltx.Header{Version: ltx.Version, Flags: ltx.HeaderFlagNoChecksum, PageSize: uint32(pageSize),
		Commit: npages, MinTXID: ltx.TXID(seq + 1), MaxTXID: ltx.TXID(seq + 1), Timestamp: now.UnixMilli()})
	if err != nil {
		return nil, err
	}
	lock := lockPgno(pageSize)
	page := make([]byte, pageSize)
	for _, pg := range slices.Sorted(maps.Keys(set)) {
		if pg == 0 || pg > npages || pg == lock {
			continue
		}
		if _, err := f.ReadAt(page, int64(pg-1)*int64(pageSize)); err != nil {
			return nil, err
		}
		if err := enc.EncodePage(ltx.PageHeader{Pgno: pg}, page); err != nil {
			return nil, err
		}
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return &SegmentDB{Path: rel, PageSize: pageSize, Pages: npages, LTX: buf.Bytes()}, nil
}

// Clone is a copy of b that a second LogShipper may own.
func (b *LogBase) Clone() *LogBase {
	if b == nil {
		return nil
	}
	c := &LogBase{dbs: make(map[string]*dbState, len(b.dbs))}
	for rel, st := range b.dbs {
		cp := *st
		cp.hashes = slices.Clone(st.hashes)
		if st.img != nil {
			img := *st.img
			cp.img = &img
		}
		c.dbs[rel] = &cp
	}
	return c
}
