package pageread

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// The wire between the box and lchat-pageread: requests on the helper's stdin, framed
// answers on its stdout. A request is an op byte, a big-endian uint32 payload length and
// the payload. An answer frame is a kind byte, a uint32 payload length, the payload and a
// CRC-32C of the three; the box checks every frame's kind, length and checksum before it
// uses a byte of it (client.go). The checksum catches a torn or misframed stream, not a
// lying helper: what a helper under the space's uid sends is the space's own data, and
// the box bounds and checks its shape (page size, page count against the files' sizes,
// page numbers, order) rather than trusting it.
//
// A session (Version 2) starts with a hello and serves views in turn: an open, the view's
// requests, an end (the view's lock let go, its connection kept), then the next open or a
// forget, until the box closes the helper's stdin. A box of version 1 sent no hello and
// one view per helper: the helper still serves that. A helper of version 1 answers the
// hello with an error ("first request is 'V', not open"), which the box reports as an
// old helper.
const (
	opHello    = 'V' // uint32 Version: the first request of a session
	opOpen     = 'O' // flags byte (openSince, openTail), WALPos (walPosLen), path
	opIndexAll = 'I'
	opChanged  = 'T'
	opRead     = 'R' // uint32 page numbers
	opScan     = 'A'
	opEnd      = 'X' // empty: ends the view, keeping its connection
	opForget   = 'F' // path: closes the connection kept for it (between views)

	frameHello   = 'V' // uint32: the helper's Version
	frameShape   = 'S' // shapeLen bytes
	framePage    = 'P' // uint32 pgno, then the page
	frameChanged = 'C' // uint32 page numbers, at most maxChangedPerFrame
	frameDone    = 'D' // empty: the request is answered
	frameError   = 'E' // a message of at most maxErrorLen bytes; the session ends
)

// The flags of an open.
const (
	openSince = 1 << 0 // the WALPos is the caller's: a tail view
	openTail  = 1 << 1 // a log segment's: the tail may be read without the lock (a helper older than this flag ignores it and locks)
)

// Version is the wire's protocol version: 2 serves many views per helper (1 served one).
const Version = 2

const (
	walPosLen          = 8 + 8 + 4 + 4 + 8 + 4 + 4
	shapeLen           = 8 + 8 + 4 + 4 + walPosLen + 1
	maxChangedPerFrame = 16384
	maxErrorLen        = 1024
	// maxRequest bounds a request the helper accepts: a read of at most maxReadBatch pages.
	maxReadBatch = 1 << 16
	maxRequest   = 4*maxReadBatch + 4096 + 1 + walPosLen
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func putWALPos(b []byte, p WALPos) {
	binary.BigEndian.PutUint64(b[0:], p.Dev)
	binary.BigEndian.PutUint64(b[8:], p.Ino)
	binary.BigEndian.PutUint32(b[16:], p.Salt1)
	binary.BigEndian.PutUint32(b[20:], p.Salt2)
	binary.BigEndian.PutUint64(b[24:], uint64(p.Frames))
	binary.BigEndian.PutUint32(b[32:], p.Ck1)
	binary.BigEndian.PutUint32(b[36:], p.Ck2)
}

func getWALPos(b []byte) WALPos {
	return WALPos{
		Dev: binary.BigEndian.Uint64(b[0:]), Ino: binary.BigEndian.Uint64(b[8:]),
		Salt1: binary.BigEndian.Uint32(b[16:]), Salt2: binary.BigEndian.Uint32(b[20:]),
		Frames: int64(binary.BigEndian.Uint64(b[24:])),
		Ck1:    binary.BigEndian.Uint32(b[32:]), Ck2: binary.BigEndian.Uint32(b[36:]),
	}
}

func putShape(b []byte, s Shape) {
	binary.BigEndian.PutUint64(b[0:], s.Dev)
	binary.BigEndian.PutUint64(b[8:], s.Ino)
	binary.BigEndian.PutUint32(b[16:], uint32(s.PageSize))
	binary.BigEndian.PutUint32(b[20:], s.Pages)
	putWALPos(b[24:], s.Pos)
	b[24+walPosLen] = 0
	if s.Tail {
		b[24+walPosLen] = 1
	}
}

func getShape(b []byte) Shape {
	return Shape{
		Dev: binary.BigEndian.Uint64(b[0:]), Ino: binary.BigEndian.Uint64(b[8:]),
		PageSize: int(binary.BigEndian.Uint32(b[16:])), Pages: binary.BigEndian.Uint32(b[20:]),
		Pos: getWALPos(b[24:]), Tail: b[24+walPosLen] == 1,
	}
}

// frameWriter writes answer frames (the helper's side).
type frameWriter struct {
	w   io.Writer
	buf []byte
}

func (fw *frameWriter) frame(kind byte, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	fw.buf = append(fw.buf[:0], kind, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(fw.buf[1:], uint32(n))
	for _, p := range parts {
		fw.buf = append(fw.buf, p...)
	}
	fw.buf = binary.BigEndian.AppendUint32(fw.buf, crc32.Checksum(fw.buf, castagnoli))
	_, err := fw.w.Write(fw.buf)
	return err
}

// writeRequest writes one request (the box's side).
func writeRequest(w io.Writer, op byte, payload []byte) error {
	b := make([]byte, 5, 5+len(payload))
	b[0] = op
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	_, err := w.Write(append(b, payload...))
	return err
}

// readRequest reads one request (the helper's side); io.EOF when the box closed the pipe.
func readRequest(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxRequest {
		return 0, nil, fmt.Errorf("request of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, nil, unexpected(err)
	}
	return hdr[0], b, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
