package pageread

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Serve answers the box's requests on r with frames on w, reading with View: it is what
// lchat-pageread runs. The first request must open a database; the session ends when r
// ends (nil) or at the first error, which is also sent to the box as an error frame.
func Serve(ctx context.Context, r io.Reader, w io.Writer) error {
	// Pages go out in large writes: a write per page would cost the box a wake-up each.
	bw := bufio.NewWriterSize(w, 256<<10)
	fw := &frameWriter{w: bw}
	err := serve(ctx, r, fw)
	if err != nil && !errors.Is(err, errWrite) {
		fw.frame(frameError, []byte(clip(err.Error())))
	}
	bw.Flush()
	return err
}

var errWrite = errors.New("writing to the box")

func serve(ctx context.Context, r io.Reader, fw *frameWriter) error {
	op, req, err := readRequest(r)
	if err != nil {
		return err
	}
	if op != opOpen || len(req) < 1+walPosLen {
		return fmt.Errorf("first request is %q, not open", op)
	}
	var since *WALPos
	if req[0]&1 != 0 {
		p := getWALPos(req[1:])
		since = &p
	}
	v, err := Open(ctx, string(req[1+walPosLen:]), since)
	if err != nil {
		return err
	}
	defer v.Close()
	shape := make([]byte, shapeLen)
	send := func(kind byte, parts ...[]byte) error {
		err := fw.frame(kind, parts...)
		if err == nil && kind != framePage && kind != frameChanged {
			err = fw.w.(*bufio.Writer).Flush() // the end of an answer: the box waits for it
		}
		if err != nil {
			return fmt.Errorf("%w: %v", errWrite, err)
		}
		return nil
	}
	putShape(shape, v.Shape())
	if err := send(frameShape, shape); err != nil {
		return err
	}
	var pgno [4]byte
	page := func(pg uint32, data []byte) error {
		binary.BigEndian.PutUint32(pgno[:], pg)
		return send(framePage, pgno[:], data)
	}
	for {
		op, req, err := readRequest(r)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch op {
		case opIndexAll:
			if err := v.IndexAll(); err != nil {
				return err
			}
			putShape(shape, v.Shape())
			err = send(frameShape, shape)
		case opChanged:
			pages, _ := v.ChangedSinceTail()
			for len(pages) > 0 && err == nil {
				n := min(len(pages), maxChangedPerFrame)
				b := make([]byte, 4*n)
				for i, pg := range pages[:n] {
					binary.BigEndian.PutUint32(b[4*i:], pg)
				}
				err = send(frameChanged, b)
				pages = pages[n:]
			}
		case opRead:
			if len(req)%4 != 0 {
				return fmt.Errorf("read request of %d bytes", len(req))
			}
			pgs := make([]uint32, len(req)/4)
			for i := range pgs {
				pgs[i] = binary.BigEndian.Uint32(req[4*i:])
			}
			err = v.ReadPages(pgs, page)
		case opScan:
			err = v.Scan(page)
		default:
			return fmt.Errorf("unknown request %q", op)
		}
		if err == nil {
			err = send(frameDone)
		}
		if err != nil {
			return err
		}
	}
}

// clip bounds an error message for its frame, keeping it valid UTF-8.
func clip(s string) string {
	if len(s) <= maxErrorLen {
		return s
	}
	s = s[:maxErrorLen]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return strings.TrimSpace(s)
}
