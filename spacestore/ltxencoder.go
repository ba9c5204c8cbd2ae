package spacestore

import (
	"bytes"
	"sync"

	"github.com/superfly/ltx"
)

// ltxEncoders keeps the encoders of encodeLTX for the next LTX file. An ltx.Encoder holds
// its LZ4 compressor by value, a 128 KiB hash table, and ltx (v0.5.3) has no Reset: a new
// encoder for every log segment, one every few ms of a busy space, was most of the memory a
// cut allocated.
var ltxEncoders sync.Pool

// ltxEncoder is an ltx.Encoder that writes into out, and fresh, the encoder as
// ltx.NewEncoder made it, which each file starts from.
//
// Copying fresh over enc makes a new encoder, as ltx v0.5.3 writes it (encoder.go):
// NewEncoder sets w (here &out, whose address never changes), state and spillThreshold,
// and nothing else; every other field stays zero until a file's encoding sets it. So the
// copy puts back all a file leaves behind (header, trailer, hash, page index, byte count,
// last page, the compressor's buffer, a spill, an aborted state), and shares nothing with
// fresh but the writer: fresh is never encoded with, its other pointers and slices stay
// nil. The compressor's table comes back zero too, though it need not: CompressBlock
// clears the table's in-use bits before each block, so no block's output depends on an
// earlier one. The encoder has no lock and no pointer into itself, so a copy of it is a
// whole encoder. The copy moves the table's 128 KiB, a few µs a file, where a new encoder
// allocated and cleared as much. An ltx upgrade must keep all this true:
// TestLTXEncoderReuse compares the files with new encoders'.
type ltxEncoder struct {
	enc, fresh ltx.Encoder
	out        bytes.Buffer
}

// maxPooledLTX bounds the output buffer an encoder keeps in the pool: a checkpoint's delta
// may be large, a log segment's is not.
const maxPooledLTX = 1 << 20

func newLTXEncoder() (*ltxEncoder, error) {
	e := new(ltxEncoder)
	enc, err := ltx.NewEncoder(&e.out)
	if err != nil {
		return nil, err
	}
	e.fresh = *enc
	return e, nil
}

// encode writes one LTX file with write, on the encoder started afresh, and returns a copy
// of it (the encoder's buffer is the next file's).
func (e *ltxEncoder) encode(write func(*ltx.Encoder) error) ([]byte, error) {
	e.enc = e.fresh
	e.out.Reset()
	if err := write(&e.enc); err != nil {
		return nil, err
	}
	return bytes.Clone(e.out.Bytes()), nil
}

// encodeLTX writes one LTX file with write, on an encoder of the pool, and returns it.
func encodeLTX(write func(*ltx.Encoder) error) ([]byte, error) {
	e, _ := ltxEncoders.Get().(*ltxEncoder)
	if e == nil {
		var err error
		if e, err = newLTXEncoder(); err != nil {
			return nil, err
		}
	}
	defer func() {
		if e.out.Cap() > maxPooledLTX {
			e.out = bytes.Buffer{}
		}
		ltxEncoders.Put(e)
	}()
	return e.encode(write)
}
