package pageread

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"unicode"
)

// Files is what the box itself found of a database's files (its own lstat of the main file
// and the WAL, never the helper's word): the helper's answers are checked against it.
type Files struct {
	Dev, Ino          uint64
	MainSize, WALSize int64
}

// Client is a Source whose pages lchat-pageread reads under the space's uid and sends over
// a pipe. Everything it receives is untrusted: each frame's kind, length and checksum are
// checked before use, the shape against the box's own Files (page size, page count against
// the files' sizes, WAL frames against the WAL's size, the file's identity), page numbers
// against the request, and it never holds more than one frame (a page of at most 64 KiB)
// besides the changed-page list, which is bounded by the WAL's size. The first error ends
// the session: every later call returns it.
type Client struct {
	r     *bufio.Reader
	w     io.Writer
	files Files
	since *WALPos
	shape Shape
	buf   []byte
	err   error
}

// Dial asks the helper on (r, w) to open the database at path (since as in Open) and
// checks the shape it answers with.
func Dial(r io.Reader, w io.Writer, path string, since *WALPos, files Files) (*Client, error) {
	c := &Client{r: bufio.NewReaderSize(r, 256<<10), w: w, files: files, since: since}
	req := make([]byte, 1+walPosLen, 1+walPosLen+len(path))
	if since != nil {
		req[0] = 1
		putWALPos(req[1:], *since)
	}
	if err := c.request(opOpen, append(req, path...)); err != nil {
		return nil, err
	}
	s, err := c.readShape()
	if err != nil {
		return nil, err
	}
	c.shape = s
	return c, nil
}

// Shape returns the checked shape.
func (c *Client) Shape() Shape { return c.shape }

// IndexAll asks the helper to index every frame; the shape must stay the same but for Tail.
func (c *Client) IndexAll() error {
	if !c.shape.Tail || c.err != nil {
		return c.err
	}
	if err := c.request(opIndexAll, nil); err != nil {
		return err
	}
	s, err := c.readShape()
	if err != nil {
		return err
	}
	if err := c.readDone(); err != nil {
		return err
	}
	want := c.shape
	want.Tail = false
	if s != want {
		return c.fail(fmt.Errorf("page reader changed the database's shape while indexing: %+v, then %+v", c.shape, s))
	}
	c.shape = s
	return nil
}

// ChangedSinceTail returns the pages the helper found written since the caller's WALPos:
// strictly ascending, within the database, and no more than the WAL frames read since.
func (c *Client) ChangedSinceTail() ([]uint32, error) {
	if c.err != nil {
		return nil, c.err
	}
	if err := c.request(opChanged, nil); err != nil {
		return nil, err
	}
	limit := c.shape.Pos.Frames
	if c.shape.Tail && c.since != nil {
		limit -= c.since.Frames
	}
	var out []uint32
	for {
		kind, b, err := c.readFrame()
		if err != nil {
			return nil, err
		}
		if kind == frameDone {
			return out, nil
		}
		if kind != frameChanged {
			return nil, c.fail(fmt.Errorf("page reader sent frame %q for the changed pages", kind))
		}
		if int64(len(out)+len(b)/4) > limit {
			return nil, c.fail(fmt.Errorf("page reader listed more changed pages than the %d WAL frames read", limit))
		}
		for i := 0; i < len(b); i += 4 {
			pg := binary.BigEndian.Uint32(b[i:])
			if pg < 1 || pg > c.shape.Pages || (len(out) > 0 && pg <= out[len(out)-1]) {
				return nil, c.fail(fmt.Errorf("page reader listed page %d out of order or outside %d pages", pg, c.shape.Pages))
			}
			out = append(out, pg)
		}
	}
}

// ReadPages reads pgnos (each within the database) through the helper, in order.
func (c *Client) ReadPages(pgnos []uint32, fn func(pgno uint32, data []byte) error) error {
	for _, pg := range pgnos {
		if pg < 1 || pg > c.shape.Pages {
			return fmt.Errorf("page %d is outside the database (%d pages)", pg, c.shape.Pages)
		}
	}
	for len(pgnos) > 0 {
		if c.err != nil {
			return c.err
		}
		batch := pgnos[:min(len(pgnos), maxReadBatch)]
		pgnos = pgnos[len(batch):]
		req := make([]byte, 4*len(batch))
		for i, pg := range batch {
			binary.BigEndian.PutUint32(req[4*i:], pg)
		}
		if err := c.request(opRead, req); err != nil {
			return err
		}
		if err := c.pages(batch, 0, fn); err != nil {
			return err
		}
	}
	return nil
}

// Scan reads every page through the helper, in order.
func (c *Client) Scan(fn func(pgno uint32, data []byte) error) error {
	if c.err != nil {
		return c.err
	}
	if err := c.request(opScan, nil); err != nil {
		return err
	}
	return c.pages(nil, c.shape.Pages, fn)
}

// pages reads the page frames answering a read of want (or, with want nil, a scan of
// pages 1..all) and the frame that ends them.
func (c *Client) pages(want []uint32, all uint32, fn func(uint32, []byte) error) error {
	n := uint32(len(want))
	if want == nil {
		n = all
	}
	for i := uint32(0); i <= n; i++ {
		kind, b, err := c.readFrame()
		if err != nil {
			return err
		}
		if i == n {
			if kind != frameDone {
				return c.fail(fmt.Errorf("page reader sent frame %q after the %d pages asked for", kind, n))
			}
			return nil
		}
		exp := i + 1
		if want != nil {
			exp = want[i]
		}
		if kind != framePage || binary.BigEndian.Uint32(b) != exp {
			return c.fail(fmt.Errorf("page reader sent frame %q where page %d was due", kind, exp))
		}
		if err := fn(exp, b[4:]); err != nil {
			// The rest of the answer is unread: the session cannot go on.
			return c.fail(err)
		}
	}
	return nil
}

// Close ends the session (the helper's process is its owner's to end).
func (c *Client) Close() error {
	if c.err == nil {
		c.err = errors.New("page reader session closed")
	}
	return nil
}

func (c *Client) fail(err error) error {
	if c.err == nil {
		c.err = err
	}
	return err
}

func (c *Client) request(op byte, payload []byte) error {
	if c.err != nil {
		return c.err
	}
	if err := writeRequest(c.w, op, payload); err != nil {
		return c.fail(fmt.Errorf("writing to the page reader: %w", err))
	}
	return nil
}

// readDone reads the frame that ends an answer.
func (c *Client) readDone() error {
	kind, _, err := c.readFrame()
	if err != nil {
		return err
	}
	if kind != frameDone {
		return c.fail(fmt.Errorf("page reader sent frame %q, not the end of its answer", kind))
	}
	return nil
}

func (c *Client) readShape() (Shape, error) {
	kind, b, err := c.readFrame()
	if err != nil {
		return Shape{}, err
	}
	if kind != frameShape {
		return Shape{}, c.fail(fmt.Errorf("page reader sent frame %q, not the database's shape", kind))
	}
	s := getShape(b)
	if err := c.checkShape(s); err != nil {
		return Shape{}, c.fail(err)
	}
	return s, nil
}

// checkShape holds the helper's shape against what the box itself knows of the files.
func (c *Client) checkShape(s Shape) error {
	if !ValidPageSize(s.PageSize) {
		return fmt.Errorf("page reader gives page size %d", s.PageSize)
	}
	if s.Dev != c.files.Dev || s.Ino != c.files.Ino {
		return errors.New("page reader read another file than the box found (swapped while checkpointing?)")
	}
	if int64(s.Pages)*int64(s.PageSize) > c.files.MainSize+c.files.WALSize+int64(s.PageSize) {
		return fmt.Errorf("page reader claims %d pages of %d bytes, more than the files hold", s.Pages, s.PageSize)
	}
	var frames int64
	if c.files.WALSize >= 32 {
		frames = (c.files.WALSize - 32) / int64(24+s.PageSize)
	}
	if s.Pos.Frames < 0 || s.Pos.Frames > frames {
		return fmt.Errorf("page reader claims %d WAL frames, more than the WAL holds (%d)", s.Pos.Frames, frames)
	}
	if s.Tail && (c.since == nil || s.Pos.Dev != c.since.Dev || s.Pos.Ino != c.since.Ino ||
		s.Pos.Salt1 != c.since.Salt1 || s.Pos.Salt2 != c.since.Salt2 || s.Pos.Frames < c.since.Frames) {
		return errors.New("page reader claims a tail view of another WAL")
	}
	return nil
}

// readFrame reads one frame whose kind and length are valid at this point of the session
// and whose checksum holds; an error frame ends the session with its (cleaned) message.
func (c *Client) readFrame() (byte, []byte, error) {
	if c.err != nil {
		return 0, nil, c.err
	}
	var hdr [5]byte
	if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
		return 0, nil, c.fail(fmt.Errorf("reading from the page reader: %w", unexpected(err)))
	}
	kind, n := hdr[0], binary.BigEndian.Uint32(hdr[1:])
	ok := false
	switch kind {
	case frameShape:
		ok = n == shapeLen
	case framePage:
		ok = c.shape.PageSize > 0 && n == uint32(4+c.shape.PageSize)
	case frameChanged:
		ok = n > 0 && n%4 == 0 && n <= 4*maxChangedPerFrame
	case frameDone:
		ok = n == 0
	case frameError:
		ok = n <= maxErrorLen
	}
	if !ok {
		return 0, nil, c.fail(fmt.Errorf("page reader sent a frame of kind %q and %d bytes", kind, n))
	}
	if cap(c.buf) < int(n)+4 {
		c.buf = make([]byte, max(int(n)+4, 1024))
	}
	b := c.buf[:n+4]
	if _, err := io.ReadFull(c.r, b); err != nil {
		return 0, nil, c.fail(fmt.Errorf("reading from the page reader: %w", unexpected(err)))
	}
	sum := crc32.Update(crc32.Checksum(hdr[:], castagnoli), castagnoli, b[:n])
	if sum != binary.BigEndian.Uint32(b[n:]) {
		return 0, nil, c.fail(fmt.Errorf("page reader frame of kind %q fails its checksum", kind))
	}
	if kind == frameError {
		return 0, nil, c.fail(&HelperError{Msg: clean(string(b[:n]))})
	}
	return kind, b[:n], nil
}

// HelperError is an error the helper reported (its message cleaned of control characters).
type HelperError struct{ Msg string }

func (e *HelperError) Error() string { return e.Msg }

func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return '?'
		}
		return r
	}, s)
}

// Interface guards
var _ Source = (*Client)(nil)
