package pageread

import (
	"bytes"
	"encoding/binary"
	"io"
	"strings"
	"testing"
)

// A lying helper: these tests write the helper's side of the wire by hand, as a compromised
// lchat-pageread could, and check what the box's Client makes of it.

var goodFiles = Files{Dev: 1, Ino: 2, MainSize: 8 * 4096, WALSize: 32 + 3*(24+4096)}

func goodShape() Shape {
	return Shape{Dev: 1, Ino: 2, PageSize: 4096, Pages: 8, Pos: WALPos{Dev: 1, Ino: 3, Frames: 3}}
}

type stream struct{ bytes.Buffer }

// newStream is a helper's answer so far: its hello, as a helper of this Version says it.
func newStream() *stream {
	return new(stream).frame(frameHello, binary.BigEndian.AppendUint32(nil, Version))
}

func (s *stream) frame(kind byte, parts ...[]byte) *stream {
	(&frameWriter{w: &s.Buffer}).frame(kind, parts...)
	return s
}

func (s *stream) shape(sh Shape) *stream {
	b := make([]byte, shapeLen)
	putShape(b, sh)
	return s.frame(frameShape, b)
}

func (s *stream) page(pg uint32, size int) *stream {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], pg)
	return s.frame(framePage, n[:], make([]byte, size))
}

func dial(t *testing.T, s *stream, since *WALPos) (*Client, error) {
	t.Helper()
	return Dial(bytes.NewReader(s.Bytes()), io.Discard, "/d/app.db", since, goodFiles)
}

func TestClientRefusesBadShapes(t *testing.T) {
	cases := []struct {
		name string
		mut  func(*Shape)
		want string
	}{
		{"page size 3", func(s *Shape) { s.PageSize = 3 }, "page size 3"},
		{"page size 128 KiB", func(s *Shape) { s.PageSize = 1 << 17 }, "page size"},
		{"more pages than the files hold", func(s *Shape) { s.Pages = 13 }, "more than the files hold"},
		{"4 G pages", func(s *Shape) { s.Pages = 0xffffffff }, "more than the files hold"},
		{"more WAL frames than the WAL holds", func(s *Shape) { s.Pos.Frames = 4 }, "more than the WAL holds"},
		{"negative WAL frames", func(s *Shape) { s.Pos.Frames = -1 }, "WAL frames"},
		{"another file", func(s *Shape) { s.Ino = 9 }, "another file"},
		{"a tail nobody asked for", func(s *Shape) { s.Tail = true }, "tail view"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sh := goodShape()
			c.mut(&sh)
			_, err := dial(t, newStream().shape(sh), nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
	if _, err := dial(t, newStream().shape(goodShape()), nil); err != nil {
		t.Fatalf("a good shape: %v", err)
	}
}

// TestClientTakesTheTailsAViewFollows: a tail view's position is one the helper's view
// may reach from the caller's: on the same salts and no earlier, or past the one WAL
// restart followTail follows (an isolated space's cut after each restart took the lock's
// way or failed before); any other is refused.
func TestClientTakesTheTailsAViewFollows(t *testing.T) {
	since := WALPos{Dev: 1, Ino: 3, Salt1: 7, Salt2: 70, Frames: 2}
	cases := []struct {
		name string
		pos  WALPos
		ok   bool
	}{
		{"more frames, same salts", WALPos{Dev: 1, Ino: 3, Salt1: 7, Salt2: 70, Frames: 3}, true},
		{"nothing new", since, true},
		{"fewer frames, same salts", WALPos{Dev: 1, Ino: 3, Salt1: 7, Salt2: 70, Frames: 1}, false},
		{"one restart, fewer frames", WALPos{Dev: 1, Ino: 3, Salt1: 8, Salt2: 5, Frames: 1}, true},
		{"one restart, no frame", WALPos{Dev: 1, Ino: 3, Salt1: 8, Salt2: 5, Frames: 0}, false},
		{"two restarts", WALPos{Dev: 1, Ino: 3, Salt1: 9, Salt2: 5, Frames: 3}, false},
		{"another second salt", WALPos{Dev: 1, Ino: 3, Salt1: 7, Salt2: 71, Frames: 3}, false},
		{"another WAL file", WALPos{Dev: 1, Ino: 4, Salt1: 8, Salt2: 5, Frames: 1}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sh := goodShape()
			sh.Tail, sh.Pos = true, c.pos
			_, err := dial(t, newStream().shape(sh), &since)
			if c.ok && err != nil || !c.ok && (err == nil || !strings.Contains(err.Error(), "tail view of another WAL")) {
				t.Fatalf("a tail at %+v from %+v: %v", c.pos, since, err)
			}
		})
	}
}

func TestClientRefusesBadFrames(t *testing.T) {
	scan := func(s *stream) error {
		c, err := dial(t, s, nil)
		if err != nil {
			return err
		}
		n := 0
		return c.Scan(func(uint32, []byte) error { n++; return nil })
	}
	full := func() *stream {
		s := newStream().shape(goodShape())
		return s
	}
	withPages := func(s *stream, pgs ...uint32) *stream {
		for _, pg := range pgs {
			s.page(pg, 4096)
		}
		return s
	}
	corrupt := withPages(full(), 1, 2, 3)
	corrupt.Bytes()[corrupt.Len()-10] ^= 1
	huge := full()
	huge.Write([]byte{framePage, 0x7f, 0xff, 0xff, 0xff})
	cases := []struct {
		name string
		s    *stream
		want string
	}{
		{"pages out of order", withPages(full(), 1, 3), "page 2 was due"},
		{"a page of the wrong size", full().page(1, 512), "frame of kind 'P' and 516 bytes"},
		{"a 2 GiB frame", huge, "2147483647 bytes"},
		{"a checksum that fails", corrupt, "checksum"},
		{"more pages than asked", func() *stream { s := withPages(full(), 1, 2, 3, 4, 5, 6, 7, 8); s.page(9, 4096); return s }(), "after the 8 pages"},
		{"the stream ends", withPages(full(), 1, 2), "unexpected EOF"},
		{"an unknown frame", full().frame('Z'), "kind 'Z'"},
		{"an error with control characters", full().frame(frameError, []byte("bad\x1b[31m\nline")), "bad?[31m?line"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := scan(c.s)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
	ok := withPages(full(), 1, 2, 3, 4, 5, 6, 7, 8).frame(frameDone)
	if err := scan(ok); err != nil {
		t.Fatalf("a good scan: %v", err)
	}
}

func TestClientRefusesBadChangedLists(t *testing.T) {
	since := &WALPos{Dev: 1, Ino: 3, Frames: 1}
	sh := goodShape()
	sh.Tail = true
	list := func(pgs ...uint32) []byte {
		b := make([]byte, 4*len(pgs))
		for i, pg := range pgs {
			binary.BigEndian.PutUint32(b[4*i:], pg)
		}
		return b
	}
	cases := []struct {
		name string
		pgs  []uint32
		want string
	}{
		{"descending", []uint32{2, 1}, "out of order"},
		{"repeated", []uint32{2, 2}, "out of order"},
		{"beyond the database", []uint32{9}, "outside 8 pages"},
		{"page 0", []uint32{0}, "outside"},
		{"more than the frames read since", []uint32{1, 2, 3}, "more changed pages than the 2 WAL frames"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl, err := dial(t, newStream().shape(sh).frame(frameChanged, list(c.pgs...)).frame(frameDone), since)
			if err != nil {
				t.Fatal(err)
			}
			_, err = cl.ChangedSinceTail()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
	cl, err := dial(t, newStream().shape(sh).frame(frameChanged, list(2, 5)).frame(frameDone), since)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cl.ChangedSinceTail(); err != nil || len(got) != 2 {
		t.Fatalf("a good list: %v, %v", got, err)
	}
	// Past a WAL restart the frames read are the old ones after since and the new ones:
	// at most the file's 3, however few the new salts have.
	restarted := sh
	restarted.Pos = WALPos{Dev: 1, Ino: 3, Salt1: 1, Frames: 1}
	for _, c := range []struct {
		pgs []uint32
		ok  bool
	}{{[]uint32{1, 2, 3}, true}, {[]uint32{1, 2, 3, 4}, false}} {
		cl, err := dial(t, newStream().shape(restarted).frame(frameChanged, list(c.pgs...)).frame(frameDone), since)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := cl.ChangedSinceTail(); c.ok != (err == nil) {
			t.Fatalf("%d pages changed past a restart, in a WAL of 3 frames: %v, %v", len(c.pgs), got, err)
		}
	}
}

// FuzzClient: whatever a helper sends, the box's client returns or fails; it never panics,
// and never hands fn a page of another size or number than asked.
func FuzzClient(f *testing.F) {
	good := newStream().shape(goodShape())
	for pg := uint32(1); pg <= 8; pg++ {
		good.page(pg, 4096)
	}
	good.frame(frameDone)
	f.Add(good.Bytes())
	f.Add(newStream().shape(goodShape()).frame(frameError, []byte("x")).Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Dial(bytes.NewReader(b), io.Discard, "/d/app.db", nil, goodFiles)
		if err != nil {
			return
		}
		want := uint32(1)
		c.Scan(func(pg uint32, data []byte) error {
			if pg != want || len(data) != c.Shape().PageSize {
				t.Fatalf("page %d of %d bytes, want page %d of %d", pg, len(data), want, c.Shape().PageSize)
			}
			want++
			return nil
		})
	})
}
