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
// lchat-pageread runs. A session serves views in turn (wire.go), keeping each database's
// connection between them (Keeper) until r ends, when it closes them and returns nil. The
// first error ends the session; it is also sent to the box as an error frame.
func Serve(ctx context.Context, r io.Reader, w io.Writer) error {
	// Pages go out in large writes: a write per page would cost the box a wake-up each.
	bw := bufio.NewWriterSize(w, 256<<10)
	fw := &frameWriter{w: bw}
	k := NewKeeper()
	err := serve(ctx, k, r, fw)
	if err != nil && !errors.Is(err, errWrite) {
		fw.frame(frameError, []byte(clip(err.Error())))
	}
	bw.Flush()
	k.Close()
	return err
}

var errWrite = errors.New("writing to the box")

// errEOF is the box closing the helper's stdin in the middle of a view: the session ends
// as it does between views.
var errEOF = errors.New("the box ended the session")

func serve(ctx context.Context, k *Keeper, r io.Reader, fw *frameWriter) error {
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
	for first := true; ; first = false {
		op, req, err := readRequest(r)
		if errors.Is(err, io.EOF) && !first {
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case op == opHello && first:
			if len(req) != 4 || binary.BigEndian.Uint32(req) != Version {
				return fmt.Errorf("the box speaks another protocol than this page reader's (version %d): install the lchat-pageread built with lchat-caddy", Version)
			}
			err = send(frameHello, binary.BigEndian.AppendUint32(nil, Version))
		case op == opOpen:
			err = serveView(ctx, k, req, r, send)
			if errors.Is(err, errEOF) {
				return nil
			}
		case op == opForget && !first:
			k.Forget(string(req))
			err = send(frameDone)
		case first:
			return fmt.Errorf("first request is %q, not open", op)
		default:
			return fmt.Errorf("request %q between views", op)
		}
		if err != nil {
			return err
		}
	}
}

// serveView opens the view asked for by req and answers its requests until it ends: errEOF
// when the box closed the session meanwhile.
func serveView(ctx context.Context, k *Keeper, req []byte, r io.Reader, send func(byte, ...[]byte) error) error {
	if len(req) < 1+walPosLen {
		return fmt.Errorf("open request of %d bytes", len(req))
	}
	var since *WALPos
	if req[0]&openSince != 0 {
		p := getWALPos(req[1:])
		since = &p
	}
	v, err := open(ctx, k, string(req[1+walPosLen:]), since, req[0]&openTail != 0)
	if err != nil {
		return err
	}
	defer v.Close()
	shape := make([]byte, shapeLen)
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
			return errEOF
		}
		if err != nil {
			return err
		}
		switch op {
		case opEnd:
			v.Close()
			return send(frameDone)
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
