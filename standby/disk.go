package standby

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/lchat/lchat-caddy/spacestore"
)

// The spool on disk:
//
//	<dir>/<host>/state.json           the current stream's id, generation and claim, the
//	                                  seals and the replaced streams (written whole: a
//	                                  temporary file, fsync, rename, fsync of the directory)
//	<dir>/<host>/<id %016x>.stream    one stream: a header, then one record per entry
//
// A stream file is append-only: a put writes one record after the last and syncs the file,
// so an acknowledgement costs one sync; the file's directory entry was fsynced when the
// stream began (before the state named it). A record is
//
//	length:4 (of the data, never 0) crc32c:4 (of BucketBefore and the data) BucketBefore:8 data
//
// The file grows ahead of its records in zeros (by its size, 64 KiB to 1 MiB at a time,
// written and fsynced before a record goes there), so a put overwrites blocks the file
// already has and its sync is an fdatasync that writes the data alone: on ext4 a third to
// a half of an fsync of an append. A length of 0 is the end of the records. A crash in the middle of a put leaves a
// record cut short or with a wrong checksum after the last good one, which the put never
// acknowledged: Open cuts it off (with the zeros). A bad record with a good one after it is
// damage, and Open fails on it. A stream file the state does not name (a crash while a
// stream was being replaced) is deleted.

const (
	stateName    = "state.json"
	streamSuffix = ".stream"
	streamMagic  = "LCSTBY\x00\x01"
	recordHeader = 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// stateFile is state.json.
type stateFile struct {
	Stream int64 `json:"stream,omitempty"` // the current stream's id; 0 for none
	Gen    int64 `json:"gen,omitempty"`
	// Claim is the current stream's; nil for none.
	Claim *spacestore.Claim `json:"claim,omitempty"`
	Seals []mark            `json:"seals,omitempty"`
	Past  []mark            `json:"past,omitempty"`
}

// stream is one open stream file and its index; its writer is the host's lock holder.
type stream struct {
	id    int64
	gen   int64
	claim spacestore.Claim
	path  string
	f     *os.File
	// size is the file's length up to the end of the last good record; alloc is its
	// length, the zeros past size included.
	size, alloc int64
	// ents indexes the entries, ents[i] holding seq i+1.
	ents []entryRef
	// bytes is the stream's size as a seal answer carries it.
	bytes int64
	// broken is the error of a write that failed: the file past size is unknown, so the
	// stream takes nothing more (a new seq 1 replaces it).
	broken error
}

type entryRef struct {
	off int64 // the record's data
	n   int
	bb  int64
}

func (st *stream) mark() mark { return mark{Gen: st.gen, Claim: st.claim} }

func streamFile(id int64) string { return fmt.Sprintf("%016x%s", id, streamSuffix) }

// createStream writes a new stream file holding e as seq 1, fsyncs it and its directory.
func createStream(dir string, id int64, m mark, e Entry) (*stream, error) {
	st := &stream{id: id, gen: m.Gen, claim: m.Claim, path: filepath.Join(dir, streamFile(id))}
	f, err := os.OpenFile(st.path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	st.f = f
	if _, err := f.WriteAt([]byte(streamMagic), 0); err != nil {
		st.remove()
		return nil, err
	}
	st.size = int64(len(streamMagic))
	st.alloc = st.size
	if err := st.append(e); err != nil {
		st.remove()
		return nil, err
	}
	if err := syncDir(dir); err != nil {
		st.remove()
		return nil, err
	}
	return st, nil
}

// append writes e as the next record and fsyncs the file. On a failure the stream is
// broken: what the file holds past the last good record is unknown.
func (st *stream) append(e Entry) error {
	rec := make([]byte, recordHeader+len(e.Data))
	binary.BigEndian.PutUint32(rec[0:], uint32(len(e.Data)))
	binary.BigEndian.PutUint64(rec[8:], uint64(e.BucketBefore))
	copy(rec[recordHeader:], e.Data)
	binary.BigEndian.PutUint32(rec[4:], crc32.Checksum(rec[8:], castagnoli))
	err := st.grow(st.size + int64(len(rec)))
	if err == nil {
		_, err = st.f.WriteAt(rec, st.size)
	}
	if err == nil {
		err = fdatasync(st.f)
	}
	if err != nil {
		st.broken = err
		st.f.Truncate(st.size) // best effort; Open cuts a torn record off anyway
		return fmt.Errorf("writing the stream: %w", err)
	}
	st.ents = append(st.ents, entryRef{off: st.size + recordHeader, n: len(e.Data), bb: e.BucketBefore})
	st.size += int64(len(rec))
	st.bytes += entrySize(e)
	return nil
}

// A stream file grows in zeros by its own size, at least minGrow and at most maxGrow at a
// time: a quiet space's file stays small, a busy one's pays an fsync of its size about once
// a megabyte.
const (
	minGrow = 64 << 10
	maxGrow = 1 << 20
)

// grow makes the file at least n bytes long, the new bytes zeros written and fsynced (the
// file's size with them), so that a record written below n needs only an fdatasync.
func (st *stream) grow(n int64) error {
	if n <= st.alloc {
		return nil
	}
	to := max(n, st.alloc+min(max(st.alloc, minGrow), maxGrow))
	zeros := make([]byte, to-st.alloc)
	if _, err := st.f.WriteAt(zeros, st.alloc); err != nil {
		return err
	}
	if err := st.f.Sync(); err != nil {
		return err
	}
	st.alloc = to
	return nil
}

// same reports whether seq holds e.
func (st *stream) same(seq int64, e Entry) (bool, error) {
	r := st.ents[seq-1]
	if r.bb != e.BucketBefore || r.n != len(e.Data) {
		return false, nil
	}
	data, err := st.read(r)
	if err != nil {
		return false, err
	}
	return bytes.Equal(data, e.Data), nil
}

func (st *stream) read(r entryRef) ([]byte, error) {
	data := make([]byte, r.n)
	if _, err := st.f.ReadAt(data, r.off); err != nil {
		return nil, fmt.Errorf("reading the stream: %w", err)
	}
	return data, nil
}

// entries reads every entry, in seq order.
func (st *stream) entries() ([]Entry, error) {
	out := make([]Entry, 0, len(st.ents))
	for _, r := range st.ents {
		data, err := st.read(r)
		if err != nil {
			return nil, err
		}
		out = append(out, Entry{BucketBefore: r.bb, Data: data})
	}
	return out, nil
}

// remove closes and deletes the stream's file (a leftover is deleted by Open).
func (st *stream) remove() {
	st.f.Close()
	os.Remove(st.path)
}

// writeState writes state.json naming cur (nil: none), seals and past.
func (h *hostSpool) writeState(cur *stream, seals, past []mark) error {
	sf := stateFile{Seals: seals, Past: past}
	if cur != nil {
		c := cur.claim
		sf.Stream, sf.Gen, sf.Claim = cur.id, cur.gen, &c
	}
	data, err := json.Marshal(sf)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(h.dir, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(h.dir, stateName+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(h.dir, stateName))
	}
	if err == nil {
		err = syncDir(h.dir)
	}
	if err == nil {
		err = syncDir(h.root) // the host's directory entry, the first time
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing the spool state: %w", err)
	}
	return nil
}

// loadHost reads one host's directory; nil when it holds nothing (it is then removed).
func loadHost(root, name string) (*hostSpool, error) {
	h := &hostSpool{name: name, root: root, dir: filepath.Join(root, name)}
	ents, err := os.ReadDir(h.dir)
	if err != nil {
		return nil, err
	}
	var sf stateFile
	statePath := filepath.Join(h.dir, stateName)
	data, err := os.ReadFile(statePath)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if err := json.Unmarshal(data, &sf); err != nil {
			return nil, fmt.Errorf("%s: %v", statePath, err)
		}
	}
	h.seals, h.past = sf.Seals, sf.Past
	for _, de := range ents {
		n := de.Name()
		idText, isStream := strings.CutSuffix(n, streamSuffix)
		id, perr := strconv.ParseInt(idText, 16, 64)
		switch {
		case isStream && perr == nil && id == sf.Stream && sf.Stream != 0:
			h.lastID = max(h.lastID, id)
		case isStream && perr == nil:
			h.lastID = max(h.lastID, id)
			os.Remove(filepath.Join(h.dir, n)) // a stream being replaced when the box stopped
		case n == stateName+".tmp":
			os.Remove(filepath.Join(h.dir, n))
		}
	}
	if sf.Stream != 0 {
		if sf.Claim == nil {
			return nil, fmt.Errorf("%s: a stream without a claim", statePath)
		}
		st, err := openStream(h.dir, sf.Stream, mark{Gen: sf.Gen, Claim: *sf.Claim})
		if err != nil {
			return nil, err
		}
		h.cur = st
	}
	if h.cur == nil && len(h.seals) == 0 && len(h.past) == 0 {
		os.RemoveAll(h.dir)
		return nil, nil
	}
	return h, nil
}

// openStream opens and checks a stream file: every record whole, its checksum right, its
// segment decoding to seq i+1 of m; a torn last record is cut off.
func openStream(dir string, id int64, m mark) (*stream, error) {
	st := &stream{id: id, gen: m.Gen, claim: m.Claim, path: filepath.Join(dir, streamFile(id))}
	f, err := os.OpenFile(st.path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	st.f = f
	fail := func(format string, args ...any) (*stream, error) {
		f.Close()
		return nil, fmt.Errorf("%s: %s", st.path, fmt.Sprintf(format, args...))
	}
	fi, err := f.Stat()
	if err != nil {
		return fail("%v", err)
	}
	end := fi.Size()
	magic := make([]byte, len(streamMagic))
	if _, err := f.ReadAt(magic, 0); err != nil || string(magic) != streamMagic {
		return fail("not a stream file")
	}
	st.size = int64(len(streamMagic))
	for st.size < end {
		e, err := readRecord(f, st.size, end)
		if errors.Is(err, errEnd) {
			break
		}
		if errors.Is(err, errTorn) {
			// A put cut by a crash before it answered: never acknowledged.
			if err := f.Truncate(st.size); err != nil {
				return fail("cutting a torn entry: %v", err)
			}
			if err := f.Sync(); err != nil {
				return fail("%v", err)
			}
			end = st.size
			break
		}
		if err != nil {
			return fail("entry %d: %v", len(st.ents)+1, err)
		}
		seg, err := spacestore.DecodeSegment(e.Data)
		if err != nil {
			return fail("entry %d: %v", len(st.ents)+1, err)
		}
		if seg.Seal || seg.Gen != m.Gen || !sameClaim(seg.Claim, m.Claim) || seg.Seq != int64(len(st.ents))+1 {
			return fail("entry %d is segment %d of generation %d by %s, not of this stream", len(st.ents)+1, seg.Seq, seg.Gen, seg.Claim.Holder)
		}
		st.ents = append(st.ents, entryRef{off: st.size + recordHeader, n: len(e.Data), bb: e.BucketBefore})
		st.size += recordHeader + int64(len(e.Data))
		st.bytes += entrySize(e)
	}
	if len(st.ents) == 0 {
		return fail("a stream with no entry")
	}
	st.alloc = end
	return st, nil
}

var (
	// errTorn is a record cut short, or with a wrong checksum, after the last good one.
	errTorn = errors.New("torn record")
	// errEnd is the zeros after the last record.
	errEnd = errors.New("end of the records")
)

// readRecord reads the record at off of a file of end bytes.
func readRecord(f *os.File, off, end int64) (Entry, error) {
	if end-off < recordHeader {
		if end-off >= 4 && zeroAt(f, off, 4) {
			return Entry{}, errEnd
		}
		return Entry{}, errTorn
	}
	hdr := make([]byte, recordHeader)
	if _, err := f.ReadAt(hdr, off); err != nil {
		return Entry{}, err
	}
	n := int64(binary.BigEndian.Uint32(hdr[0:]))
	if n == 0 {
		if bytes.Equal(hdr, make([]byte, recordHeader)) {
			return Entry{}, errEnd
		}
		return Entry{}, errTorn
	}
	if off+recordHeader+n > end {
		return Entry{}, errTorn
	}
	rec := make([]byte, 8+n)
	if _, err := f.ReadAt(rec, off+8); err != nil && err != io.EOF {
		return Entry{}, err
	}
	if crc32.Checksum(rec, castagnoli) != binary.BigEndian.Uint32(hdr[4:]) {
		if next := off + recordHeader + n; next == end || next+4 <= end && zeroAt(f, next, 4) {
			return Entry{}, errTorn // nothing after it: a put that never answered
		}
		return Entry{}, errors.New("bad checksum with entries after it")
	}
	return Entry{BucketBefore: int64(binary.BigEndian.Uint64(rec[:8])), Data: rec[8:]}, nil
}

// zeroAt reports whether f holds n zero bytes at off.
func zeroAt(f *os.File, off int64, n int) bool {
	b := make([]byte, n)
	_, err := f.ReadAt(b, off)
	return err == nil && bytes.Equal(b, make([]byte, n))
}

// syncDir fsyncs a directory, so the names in it last.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
