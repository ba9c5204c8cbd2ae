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

// Session is the box's side of one lchat-pageread process, which serves views of a
// space's databases in turn (wire.go): Open asks for a view, the view's Close ends it and
// leaves the helper's connection to the database kept for the next. Everything it receives
// is untrusted: each frame's kind, length and checksum are checked before use, and each
// view's shape against the box's own Files. The first error ends the session: every later
// call returns it, and the helper's owner ends the process. One view at a time.
type Session struct {
	r     *bufio.Reader
	w     io.Writer
	buf   []byte
	err   error
	hello bool    // the helper answered the hello
	view  *Client // the open view, nil between views
}

// NewSession is a session with the helper whose stdout is r and stdin w.
func NewSession(r io.Reader, w io.Writer) *Session {
	return &Session{r: bufio.NewReaderSize(r, 256<<10), w: w}
}

// Err is the error that ended the session, nil while it can serve views.
func (s *Session) Err() error { return s.err }

// Open asks the helper for a view of the database at path (since as in the package's Open)
// and checks the shape it answers with against files. The first Open also checks that the
// helper speaks this Version.
func (s *Session) Open(path string, since *WALPos, files Files) (*Client, error) {
	return s.open(path, since, files, false)
}

// OpenTail is Open for a log segment, as Keeper.OpenTail: the helper may read the tail
// without the lock (a helper older than that flag locks).
func (s *Session) OpenTail(path string, since *WALPos, files Files) (*Client, error) {
	return s.open(path, since, files, true)
}

func (s *Session) open(path string, since *WALPos, files Files, tail bool) (*Client, error) {
	if s.err != nil {
		return nil, s.err
	}
	if s.view != nil {
		return nil, errors.New("page reader session: a view is open")
	}
	if !s.hello {
		// The open goes with the hello: no round trip of its own.
		if err := s.request(opHello, binary.BigEndian.AppendUint32(nil, Version)); err != nil {
			return nil, err
		}
	}
	req := make([]byte, 1+walPosLen, 1+walPosLen+len(path))
	if since != nil {
		req[0] = openSince
		putWALPos(req[1:], *since)
	}
	if tail {
		req[0] |= openTail
	}
	if err := s.request(opOpen, append(req, path...)); err != nil {
		return nil, err
	}
	if !s.hello {
		if err := s.readHello(); err != nil {
			return nil, err
		}
		s.hello = true
	}
	c := &Client{s: s, files: files, since: since}
	sh, err := c.readShape()
	if err != nil {
		return nil, err
	}
	c.shape = sh
	s.view = c
	return c, nil
}

// readHello reads the helper's answer to the hello. A helper of version 1 knows no hello
// and answers with an error: it is named as older than the box.
func (s *Session) readHello() error {
	kind, b, err := s.readFrame(0)
	var he *HelperError
	if errors.As(err, &he) {
		return fmt.Errorf("page reader is not of this box's version %d (an older lchat-pageread? install the one built with lchat-caddy): it answered %q", Version, he.Msg)
	}
	if err != nil {
		return err
	}
	if kind != frameHello || len(b) != 4 {
		return s.fail(fmt.Errorf("page reader sent frame %q, not its version", kind))
	}
	if v := binary.BigEndian.Uint32(b); v != Version {
		return s.fail(fmt.Errorf("page reader speaks version %d, this box %d: install the lchat-pageread built with lchat-caddy", v, Version))
	}
	return nil
}

// Forget asks the helper to close the connection it keeps for path (between views).
func (s *Session) Forget(path string) error {
	if s.err != nil {
		return s.err
	}
	if s.view != nil {
		return errors.New("page reader session: a view is open")
	}
	if err := s.request(opForget, []byte(path)); err != nil {
		return err
	}
	return s.readDone()
}

// Client is a Source whose pages lchat-pageread reads under the space's uid and sends over
// a pipe: one view of a Session. Everything it receives is untrusted: the shape is checked
// against the box's own Files (page size, page count against the files' sizes, WAL frames
// against the WAL's size, the file's identity), page numbers against the request, and it
// never holds more than one frame (a page of at most 64 KiB) besides the changed-page
// list, which is bounded by the WAL's size. An error ends the session.
type Client struct {
	s      *Session
	files  Files
	since  *WALPos
	shape  Shape
	closed bool
}

// Dial starts a session with the helper on (r, w) and opens its first view: Open of a
// NewSession.
func Dial(r io.Reader, w io.Writer, path string, since *WALPos, files Files) (*Client, error) {
	return NewSession(r, w).Open(path, since, files)
}

// Shape returns the checked shape.
func (c *Client) Shape() Shape { return c.shape }

// IndexAll asks the helper to index every frame; the shape must stay the same but for Tail.
func (c *Client) IndexAll() error {
	if err := c.usable(); err != nil || !c.shape.Tail {
		return err
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
	if err := c.usable(); err != nil {
		return nil, err
	}
	if err := c.request(opChanged, nil); err != nil {
		return nil, err
	}
	limit := c.shape.Pos.Frames
	switch {
	case !c.shape.Tail || c.since == nil:
	case c.shape.Pos.Salt1 == c.since.Salt1 && c.shape.Pos.Salt2 == c.since.Salt2:
		limit -= c.since.Frames
	default:
		// Past a restart (followsFrom): the old salts' frames after the caller's position,
		// then the new ones from the file's start, all within the file.
		limit = walFrames(c.files, c.shape.PageSize)
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
		if err := c.usable(); err != nil {
			return err
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
	if err := c.usable(); err != nil {
		return err
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

// Close ends the view: the helper lets its lock go and keeps its connection. An error
// means the session ended (its owner ends the helper); Close is idempotent.
func (c *Client) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	s := c.s
	if s.view != c {
		return nil
	}
	s.view = nil
	if s.err != nil {
		return s.err
	}
	if err := s.request(opEnd, nil); err != nil {
		return err
	}
	return s.readDone()
}

// usable is nil while the view can be read.
func (c *Client) usable() error {
	if c.closed {
		return errors.New("page reader view closed")
	}
	return c.s.err
}

func (c *Client) fail(err error) error { return c.s.fail(err) }

func (c *Client) request(op byte, payload []byte) error { return c.s.request(op, payload) }

func (c *Client) readDone() error { return c.s.readDone() }

func (c *Client) readFrame() (byte, []byte, error) { return c.s.readFrame(c.shape.PageSize) }

func (s *Session) fail(err error) error {
	if s.err == nil {
		s.err = err
	}
	return err
}

func (s *Session) request(op byte, payload []byte) error {
	if s.err != nil {
		return s.err
	}
	if err := writeRequest(s.w, op, payload); err != nil {
		return s.fail(fmt.Errorf("writing to the page reader: %w", err))
	}
	return nil
}

// readDone reads the frame that ends an answer.
func (s *Session) readDone() error {
	kind, _, err := s.readFrame(0)
	if err != nil {
		return err
	}
	if kind != frameDone {
		return s.fail(fmt.Errorf("page reader sent frame %q, not the end of its answer", kind))
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
	frames := walFrames(c.files, s.PageSize)
	if s.Pos.Frames < 0 || s.Pos.Frames > frames {
		return fmt.Errorf("page reader claims %d WAL frames, more than the WAL holds (%d)", s.Pos.Frames, frames)
	}
	if s.Tail && !followsFrom(s.Pos, c.since) {
		return errors.New("page reader claims a tail view of another WAL")
	}
	return nil
}

// walFrames is how many frames of pageSize bytes the WAL the box found holds.
func walFrames(f Files, pageSize int) int64 {
	if f.WALSize < 32 {
		return 0
	}
	return (f.WALSize - 32) / int64(24+pageSize)
}

// followsFrom reports whether a tail view may end at pos for a caller at since: in the same
// WAL file, either on since's salts and no earlier, or past the one restart a view
// follows (followTail: the first salt one more, and at least one frame of the new salts).
func followsFrom(pos WALPos, since *WALPos) bool {
	if since == nil || pos.Dev != since.Dev || pos.Ino != since.Ino {
		return false
	}
	if pos.Salt1 == since.Salt1 && pos.Salt2 == since.Salt2 {
		return pos.Frames >= since.Frames
	}
	return pos.Salt1 == since.Salt1+1 && pos.Frames >= 1
}

// readFrame reads one frame whose kind and length are valid at this point of the session
// and whose checksum holds (a page frame only with pageSize, the view's, non-zero); an
// error frame ends the session with its (cleaned) message.
func (s *Session) readFrame(pageSize int) (byte, []byte, error) {
	if s.err != nil {
		return 0, nil, s.err
	}
	var hdr [5]byte
	if _, err := io.ReadFull(s.r, hdr[:]); err != nil {
		return 0, nil, s.fail(fmt.Errorf("reading from the page reader: %w", unexpected(err)))
	}
	kind, n := hdr[0], binary.BigEndian.Uint32(hdr[1:])
	ok := false
	switch kind {
	case frameShape:
		ok = n == shapeLen
	case frameHello:
		ok = n == 4
	case framePage:
		ok = pageSize > 0 && n == uint32(4+pageSize)
	case frameChanged:
		ok = n > 0 && n%4 == 0 && n <= 4*maxChangedPerFrame
	case frameDone:
		ok = n == 0
	case frameError:
		ok = n <= maxErrorLen
	}
	if !ok {
		return 0, nil, s.fail(fmt.Errorf("page reader sent a frame of kind %q and %d bytes", kind, n))
	}
	if cap(s.buf) < int(n)+4 {
		s.buf = make([]byte, max(int(n)+4, 1024))
	}
	b := s.buf[:n+4]
	if _, err := io.ReadFull(s.r, b); err != nil {
		return 0, nil, s.fail(fmt.Errorf("reading from the page reader: %w", unexpected(err)))
	}
	sum := crc32.Update(crc32.Checksum(hdr[:], castagnoli), castagnoli, b[:n])
	if sum != binary.BigEndian.Uint32(b[n:]) {
		return 0, nil, s.fail(fmt.Errorf("page reader frame of kind %q fails its checksum", kind))
	}
	if kind == frameError {
		return 0, nil, s.fail(&HelperError{Msg: clean(string(b[:n]))})
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
