package spacestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/superfly/ltx"
)

// Segment is one entry of a space's log (log.go): the pages a group of SQLite commits
// changed, per database, or, with Seal set and no databases, a takeover's seal.
type Segment struct {
	// Gen is the manifest generation the log extends; Seq the segment's place in it, from 1.
	Gen, Seq int64
	// Claim is the lease of the holder that wrote the segment (claim.go).
	Claim Claim
	// Seal marks a seal: the holder of Claim took the log over here (SealLog).
	Seal bool
	// DBs are the databases the commits changed, by path; none in a seal.
	DBs []SegmentDB
}

// SegmentDB is what a group of commits changed in one SQLite database.
type SegmentDB struct {
	// Path is the database's path relative to the data dir, slash-separated.
	Path string
	// PageSize and Pages are the database's page size and its size in pages after the
	// commits; the LTX file's header says the same.
	PageSize int
	Pages    uint32
	// LTX holds the changed pages as one LTX file (as a checkpoint's delta, encodeDelta),
	// its transaction ids the segment's seq plus one (an LTX file starting at 1 is a
	// snapshot, which must hold every page).
	LTX []byte
}

// segmentMagic starts every encoded segment; segmentVersion follows it.
const (
	segmentMagic   = "LCSG"
	segmentVersion = 1
	kindData       = 1
	kindSeal       = 2
)

// EncodeSegment encodes seg (version 1, big-endian):
//
//	"LCSG" version:1 kind:1 (1 data, 2 seal) gen:8 seq:8
//	claim: holder, incarnation, lease (each len:2 bytes), at (unix ns, 0 for none):8
//	ndb:4, then per database: path (len:2 bytes) page_size:4 pages:4 ltx (len:4 bytes)
//
// The encoding is a function of seg alone, so a retried append sends the same bytes and
// recognizes them (bucket.Landed). Its size is known from seg's lengths before a byte is
// written, so it is made in one allocation of exactly that size.
func EncodeSegment(seg *Segment) ([]byte, error) {
	if err := seg.check(); err != nil {
		return nil, err
	}
	claim := [...]string{seg.Claim.Holder, seg.Claim.Incarnation, seg.Claim.Lease}
	n := len(segmentMagic) + 2 + 8 + 8 + 8 + 4
	for _, s := range claim {
		n += 2 + len(s)
	}
	for _, d := range seg.DBs {
		n += 2 + len(d.Path) + 4 + 4 + 4 + len(d.LTX)
	}
	if n > maxSegmentBytes {
		return nil, fmt.Errorf("segment of %d bytes, more than %d", n, maxSegmentBytes)
	}
	b := make([]byte, 0, n)
	b = append(b, segmentMagic...)
	kind := byte(kindData)
	if seg.Seal {
		kind = kindSeal
	}
	b = append(b, segmentVersion, kind)
	b = binary.BigEndian.AppendUint64(b, uint64(seg.Gen))
	b = binary.BigEndian.AppendUint64(b, uint64(seg.Seq))
	for _, s := range claim {
		b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	var at int64
	if !seg.Claim.At.IsZero() {
		at = seg.Claim.At.UnixNano()
	}
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = binary.BigEndian.AppendUint32(b, uint32(len(seg.DBs)))
	for _, d := range seg.DBs {
		b = binary.BigEndian.AppendUint16(b, uint16(len(d.Path)))
		b = append(b, d.Path...)
		b = binary.BigEndian.AppendUint32(b, uint32(d.PageSize))
		b = binary.BigEndian.AppendUint32(b, d.Pages)
		b = binary.BigEndian.AppendUint32(b, uint32(len(d.LTX)))
		b = append(b, d.LTX...)
	}
	return b, nil
}

// check holds seg to what DecodeSegment accepts, short of the LTX files' contents.
func (seg *Segment) check() error {
	if seg.Gen < 0 || seg.Seq < 1 {
		return fmt.Errorf("segment %d of generation %d: out of range", seg.Seq, seg.Gen)
	}
	for _, s := range []string{seg.Claim.Holder, seg.Claim.Incarnation, seg.Claim.Lease} {
		if len(s) > maxLogString {
			return fmt.Errorf("segment claim field of %d bytes", len(s))
		}
	}
	if seg.Seal != (len(seg.DBs) == 0) {
		return errors.New("a segment is a seal exactly when it holds no database")
	}
	if len(seg.DBs) > maxSegmentDBs {
		return fmt.Errorf("segment holds %d databases, more than %d", len(seg.DBs), maxSegmentDBs)
	}
	paths := make(map[string]bool, len(seg.DBs))
	for _, d := range seg.DBs {
		if len(d.Path) > maxLogPath || !fs.ValidPath(d.Path) || d.Path == "." {
			return fmt.Errorf("segment names an invalid path %q", d.Path)
		}
		if paths[d.Path] {
			return fmt.Errorf("segment names %q twice", d.Path)
		}
		paths[d.Path] = true
		if !validPageSize(d.PageSize) {
			return fmt.Errorf("segment: %q has page size %d", d.Path, d.PageSize)
		}
		if d.Pages < 1 || d.Pages > maxLogPages {
			return fmt.Errorf("segment: %q has %d pages", d.Path, d.Pages)
		}
	}
	return nil
}

// DecodeSegment decodes and checks an encoded segment: every length within its bounds and
// within the data, no trailing bytes, a seal exactly when no database is named, each path a
// clean relative path named once, and each LTX file whole (every page frame within the data,
// page numbers ascending within the database's size, its checksum right) with the page size
// and page count the segment gives. A malformed segment is an error, never a panic, and
// nothing is allocated for data the segment does not hold.
func DecodeSegment(data []byte) (*Segment, error) {
	if len(data) > maxSegmentBytes {
		return nil, fmt.Errorf("decoding segment: %d bytes, more than %d", len(data), maxSegmentBytes)
	}
	r := segReader{b: data}
	if string(r.next(len(segmentMagic))) != segmentMagic {
		return nil, errors.New("decoding segment: not a log segment")
	}
	if v := r.u8(); v != segmentVersion {
		if r.err != nil {
			return nil, fmt.Errorf("decoding segment: %w", r.err)
		}
		return nil, fmt.Errorf("decoding segment: version %d, this box reads %d", v, segmentVersion)
	}
	seg := &Segment{}
	kind := r.u8()
	seg.Gen, seg.Seq = int64(r.u64()), int64(r.u64())
	seg.Claim.Holder = r.str16(maxLogString)
	seg.Claim.Incarnation = r.str16(maxLogString)
	seg.Claim.Lease = r.str16(maxLogString)
	if at := int64(r.u64()); at != 0 {
		seg.Claim.At = time.Unix(0, at).UTC()
	}
	n := r.u32()
	if r.err == nil && (kind != kindData && kind != kindSeal) {
		return nil, fmt.Errorf("decoding segment: kind %d", kind)
	}
	if r.err == nil && n > maxSegmentDBs {
		return nil, fmt.Errorf("decoding segment: %d databases, more than %d", n, maxSegmentDBs)
	}
	seg.Seal = kind == kindSeal
	for i := uint32(0); i < n && r.err == nil; i++ {
		var d SegmentDB
		d.Path = r.str16(maxLogPath)
		d.PageSize = int(r.u32())
		d.Pages = r.u32()
		d.LTX = r.next(int(r.u32()))
		seg.DBs = append(seg.DBs, d)
	}
	if r.err != nil {
		return nil, fmt.Errorf("decoding segment: %w", r.err)
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("decoding segment: %d bytes after its end", len(r.b))
	}
	if err := seg.check(); err != nil {
		return nil, fmt.Errorf("decoding segment: %w", err)
	}
	for _, d := range seg.DBs {
		if err := checkLTX(d, nil); err != nil {
			return nil, fmt.Errorf("decoding segment: %s: %w", d.Path, err)
		}
	}
	return seg, nil
}

// segReader reads a segment's fields; the first short read sets err and every later read
// returns zero values.
type segReader struct {
	b   []byte
	err error
}

func (r *segReader) next(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = io.ErrUnexpectedEOF
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *segReader) u8() byte {
	if b := r.next(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *segReader) u32() uint32 {
	if b := r.next(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *segReader) u64() uint64 {
	if b := r.next(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *segReader) str16(max int) string {
	b := r.next(2)
	if b == nil {
		return ""
	}
	n := int(binary.BigEndian.Uint16(b))
	if n > max && r.err == nil {
		r.err = fmt.Errorf("field of %d bytes, more than %d", n, max)
		return ""
	}
	return string(r.next(n))
}

// checkLTX checks one database's LTX file whole and calls page (when non-nil) with each
// page in order. The frames are walked first, so the decoder never allocates for a length
// the data does not hold; then the decoder checks the header, the page index and the file
// checksum. Only the block format the encoder writes is accepted.
func checkLTX(d SegmentDB, page func(pgno uint32, data []byte) error) error {
	b := d.LTX
	if len(b) < ltx.HeaderSize+ltx.PageHeaderSize+ltx.TrailerSize {
		return errors.New("LTX file too short")
	}
	bound := d.PageSize + d.PageSize/255 + 16 // lz4.CompressBlockBound
	for off := ltx.HeaderSize; ; {
		if off+ltx.PageHeaderSize > len(b) {
			return errors.New("LTX page frame past the end")
		}
		pgno := binary.BigEndian.Uint32(b[off:])
		flags := binary.BigEndian.Uint16(b[off+4:])
		off += ltx.PageHeaderSize
		if pgno == 0 && flags == 0 {
			break
		}
		if flags != ltx.PageHeaderFlagSize {
			return fmt.Errorf("LTX page %d in an unsupported frame (flags %#x)", pgno, flags)
		}
		if off+4 > len(b) {
			return errors.New("LTX page frame past the end")
		}
		size := int(binary.BigEndian.Uint32(b[off:]))
		off += 4
		if size > bound || size > len(b)-off {
			return fmt.Errorf("LTX page %d of %d compressed bytes", pgno, size)
		}
		off += size
	}
	dec := ltx.NewDecoder(bytes.NewReader(b))
	if err := dec.DecodeHeader(); err != nil {
		return fmt.Errorf("decoding LTX: %w", err)
	}
	h := dec.Header()
	if int(h.PageSize) != d.PageSize || h.Commit != d.Pages {
		return fmt.Errorf("LTX header says %d pages of %d bytes, the segment %d of %d", h.Commit, h.PageSize, d.Pages, d.PageSize)
	}
	if h.IsSnapshot() {
		return errors.New("LTX snapshot in a segment")
	}
	buf := make([]byte, d.PageSize)
	lock := lockPgno(d.PageSize)
	prev := uint32(0)
	for {
		var ph ltx.PageHeader
		err := dec.DecodePage(&ph, buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("decoding LTX: %w", err)
		}
		if ph.Pgno <= prev || ph.Pgno > d.Pages || ph.Pgno == lock {
			return fmt.Errorf("LTX page %d out of place (after %d, %d pages)", ph.Pgno, prev, d.Pages)
		}
		prev = ph.Pgno
		if page != nil {
			if err := page(ph.Pgno, buf); err != nil {
				return err
			}
		}
	}
	if err := dec.Close(); err != nil {
		return fmt.Errorf("decoding LTX: %w", err)
	}
	return nil
}
