package standby

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
)

// The stream: a holder sends a host's segments over one connection it keeps, rather than
// one request each. A segment's request costs both boxes more than the segment itself
// (the request's header, Caddy's handler chain, the client's goroutines); over a kept
// connection a segment is one write and its answer one read (docs/durability-figures.md).
//
//	POST PathPrefix+{host}+"/stream" with Connection: Upgrade and Upgrade: StreamProtocol,
//	behind the mesh token: 101 Switching Protocols, then the connection carries frames.
//	Each frame from the holder is BucketBefore (8 bytes), the segment's length (4 bytes)
//	and the segment, all big-endian, as the segment endpoint's body with a length in front;
//	the standby answers each in turn with the segment endpoint's outcome: a length (2
//	bytes), then nothing once the segment is on disk, or the error's kind, a NUL and its
//	message. A frame the standby cannot read (a length past MaxSegmentBytes, a connection
//	cut) ends the stream; one it refuses (gap, stale, sealed, ...) does not.
//
// A standby that does not offer the stream (an older version, an HTTP/2 connection)
// answers the upgrade otherwise, and the Client sends that box's segments one request each
// (Put says when it tries again).

// StreamProtocol is the Upgrade token of the stream.
const StreamProtocol = "lchat-standby-stream/1"

const (
	// streamIdle is how long the standby keeps a stream that carries no frame; a holder
	// does not reuse a connection idle for clientIdle, shorter, so that the standby's end
	// rarely closes one the holder is about to use.
	streamIdle = 2 * time.Minute
	// streamWriteTimeout bounds the write of one answer to a holder that does not read.
	streamWriteTimeout = 10 * time.Second
	// streamOffFor is how long a Client sends a standby's segments one request each after
	// the standby did not offer the stream.
	streamOffFor = 10 * time.Minute
	// maxIdleStreams bounds the idle connections a Client keeps per (standby, host).
	maxIdleStreams = 2
)

// clientIdle: see streamIdle (a variable for a test).
var clientIdle = time.Minute

// upgradeAsked reports whether r asks for the stream.
func upgradeAsked(r *http.Request) bool {
	return httpguts.HeaderValuesContainsToken(r.Header["Connection"], "upgrade") &&
		httpguts.HeaderValuesContainsToken(r.Header["Upgrade"], StreamProtocol)
}

// serveStream serves host's stream on r's connection until the holder closes it, a frame
// cannot be read, the stream is idle for streamIdle or the spool closes.
func (s *Spool) serveStream(w http.ResponseWriter, r *http.Request, host string) {
	if r.ProtoMajor != 1 || !upgradeAsked(r) {
		writeError(w, http.StatusBadRequest, "malformed",
			"a stream is an HTTP/1.1 request with Connection: Upgrade and Upgrade: "+StreamProtocol)
		return
	}
	w.Header().Set("Connection", "Upgrade")
	w.Header().Set("Upgrade", StreamProtocol)
	w.WriteHeader(http.StatusSwitchingProtocols)
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return // the status was not sent: the holder's read of it fails
	}
	defer conn.Close()
	if brw.Flush() != nil {
		return
	}
	limit := s.maxSegmentBytes()
	var head [12]byte
	for {
		conn.SetReadDeadline(time.Now().Add(streamIdle))
		if _, err := io.ReadFull(brw, head[:]); err != nil {
			return // the holder closed it, or went quiet
		}
		bb, n := int64(binary.BigEndian.Uint64(head[:8])), int64(binary.BigEndian.Uint32(head[8:]))
		if n > limit {
			// The frame's bytes are not read: nothing after it can be.
			s.answerFrame(conn, brw, fmt.Errorf("%w: segment of %d bytes, more than %d", ErrFull, n, limit))
			return
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(brw, data); err != nil {
			return
		}
		if bb < 0 {
			err = fmt.Errorf("%w: negative BucketBefore", ErrMalformed)
		} else {
			err = s.Put(host, Entry{BucketBefore: bb, Data: data})
		}
		if s.answerFrame(conn, brw, err) != nil || errors.Is(err, ErrClosed) {
			return
		}
	}
}

// answerFrame writes a frame's answer: err's kind and message, or nothing for nil.
func (s *Spool) answerFrame(conn net.Conn, brw *bufio.ReadWriter, err error) error {
	var msg string
	if err != nil {
		msg = kindOf(err) + "\x00" + err.Error()
		if len(msg) > maxErrorBody {
			msg = msg[:maxErrorBody]
		}
	}
	conn.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	brw.Write(binary.BigEndian.AppendUint16(nil, uint16(len(msg))))
	brw.WriteString(msg)
	return brw.Flush()
}

// kindOf is the wire name of err's sentinel; "" for none.
func kindOf(err error) string {
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return ""
}

// streamConn is the holder's end of one stream.
type streamConn struct {
	rwc  io.ReadWriteCloser
	br   *bufio.Reader
	used time.Time // when its last answer was read
}

// errNoStream: the standby did not offer the stream.
var errNoStream = errors.New("the standby offers no stream")

// streamKey names the connections of one (standby, host).
func streamKey(baseURL, host string) string { return baseURL + "\x00" + host }

// putStream sends e over a kept connection to the standby; errNoStream when the standby
// does not offer one (the caller sends a request instead).
func (c *Client) putStream(ctx context.Context, baseURL, host string, e Entry) error {
	for try := 0; ; try++ {
		sc, kept, err := c.takeStream(ctx, baseURL, host)
		if err != nil {
			return err
		}
		err, clean, answered := sc.put(ctx, e)
		if clean {
			c.keepStream(baseURL, host, sc)
		} else {
			sc.rwc.Close()
		}
		if err != nil && kept && !answered && try == 0 && ctx.Err() == nil && peerClosed(err) {
			// A kept connection the standby closed meanwhile (its idle timeout, a restart):
			// the segment is sent again on a new one, as a retried request would be.
			continue
		}
		if err != nil && !clean {
			return fmt.Errorf("standby %s: putting a segment of %s: %w", redact(baseURL), host, err)
		}
		return err
	}
}

// peerClosed reports whether err is what a write to or a read from a connection the peer
// had closed returns.
func peerClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE)
}

// put sends e and reads its answer. clean: the connection may carry the next frame;
// answered: an answer (or part of one) was read.
func (sc *streamConn) put(ctx context.Context, e Entry) (err error, clean, answered bool) {
	stop := context.AfterFunc(ctx, func() { sc.rwc.Close() })
	defer func() {
		if !stop() { // ctx ended: the connection is closed, and its error is ctx's
			err, clean = ctx.Err(), false
		}
	}()
	var head [12]byte
	binary.BigEndian.PutUint64(head[:8], uint64(e.BucketBefore))
	binary.BigEndian.PutUint32(head[8:], uint32(len(e.Data)))
	bufs := net.Buffers{head[:], e.Data}
	if _, err := bufs.WriteTo(sc.rwc); err != nil {
		return err, false, false
	}
	var n [2]byte
	if _, err := io.ReadFull(sc.br, n[:]); err != nil {
		return err, false, false
	}
	msg := make([]byte, binary.BigEndian.Uint16(n[:]))
	if _, err := io.ReadFull(sc.br, msg); err != nil {
		return err, false, true
	}
	sc.used = time.Now()
	if len(msg) == 0 {
		return nil, true, true
	}
	kind, text, _ := strings.Cut(string(msg), "\x00")
	text = sanitize(text)
	for _, k := range kinds {
		if k.name == kind {
			return fmt.Errorf("%s: %w", text, k.err), true, true
		}
	}
	return errors.New(text), true, true
}

// takeStream returns a kept connection to the standby for host (kept true), or opens one.
func (c *Client) takeStream(ctx context.Context, baseURL, host string) (sc *streamConn, kept bool, err error) {
	key := streamKey(baseURL, host)
	c.streamMu.Lock()
	if until, off := c.streamOff[baseURL]; off && time.Now().Before(until) {
		c.streamMu.Unlock()
		return nil, false, errNoStream
	}
	for idle := c.streams[key]; len(idle) > 0; idle = c.streams[key] {
		sc = idle[len(idle)-1]
		c.streams[key] = idle[:len(idle)-1]
		if time.Since(sc.used) < clientIdle {
			c.streamMu.Unlock()
			return sc, true, nil
		}
		sc.rwc.Close()
	}
	if len(c.streams[key]) == 0 {
		delete(c.streams, key)
	}
	c.streamMu.Unlock()
	sc, err = c.dialStream(ctx, baseURL, host)
	return sc, false, err
}

// keepStream keeps sc for the next segment of host.
func (c *Client) keepStream(baseURL, host string, sc *streamConn) {
	key := streamKey(baseURL, host)
	c.streamMu.Lock()
	defer c.streamMu.Unlock()
	if c.streams == nil {
		c.streams = make(map[string][]*streamConn)
	}
	if c.closed || len(c.streams[key]) >= maxIdleStreams {
		sc.rwc.Close()
		return
	}
	c.streams[key] = append(c.streams[key], sc)
	if now := time.Now(); now.Sub(c.swept) >= clientIdle {
		// The streams of spaces that went quiet (slept, moved): closed here rather than
		// left open until the standby's idle timeout, one descriptor each meanwhile.
		c.swept = now
		for k, idle := range c.streams {
			kept := idle[:0]
			for _, sc := range idle {
				if now.Sub(sc.used) < clientIdle {
					kept = append(kept, sc)
				} else {
					sc.rwc.Close()
				}
			}
			if len(kept) == 0 {
				delete(c.streams, k)
			} else {
				c.streams[k] = kept
			}
		}
	}
}

// dialStream opens a stream: errNoStream, remembered for streamOffFor, when the standby
// answers the upgrade with anything but 101 for a reason a request would not meet too.
func (c *Client) dialStream(ctx context.Context, baseURL, host string) (*streamConn, error) {
	u := strings.TrimRight(baseURL, "/") + PathPrefix + host + "/stream"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return nil, fmt.Errorf("standby %s: stream %s: %w", redact(baseURL), host, err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", StreamProtocol)
	c.authorize(req)
	resp, err := c.streamClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("standby %s: stream %s: %w", redact(baseURL), host, err)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if rwc, ok := resp.Body.(io.ReadWriteCloser); ok && strings.EqualFold(resp.Header.Get("Upgrade"), StreamProtocol) {
			return &streamConn{rwc: rwc, br: bufio.NewReaderSize(rwc, 512), used: time.Now()}, nil
		}
		resp.Body.Close()
		return nil, fmt.Errorf("standby %s: stream %s: 101 without the stream's upgrade", redact(baseURL), host)
	}
	defer drainClose(resp.Body)
	switch resp.StatusCode {
	case http.StatusNotFound, http.StatusBadRequest, http.StatusMethodNotAllowed, http.StatusHTTPVersionNotSupported:
		// A standby of an earlier version (no such endpoint), or a connection that cannot
		// be upgraded: its segments go one request each for a while.
		c.streamMu.Lock()
		if c.streamOff == nil {
			c.streamOff = make(map[string]time.Time)
		}
		c.streamOff[baseURL] = time.Now().Add(streamOffFor)
		c.streamMu.Unlock()
		return nil, errNoStream
	}
	return nil, answerError(baseURL, host, "opening a stream", resp)
}

// streamClient is the client's HTTP client without its overall timeout, which would also
// bound the stream's life (Put bounds each segment with its ctx).
func (c *Client) streamClient() *http.Client {
	hc := c.client()
	if hc.Timeout == 0 {
		return hc
	}
	cp := *hc
	cp.Timeout = 0
	return &cp
}

// Close closes the streams the client keeps; a later Put opens a new one.
func (c *Client) Close() {
	c.streamMu.Lock()
	defer c.streamMu.Unlock()
	c.closed = true
	for _, idle := range c.streams {
		for _, sc := range idle {
			sc.rwc.Close()
		}
	}
	c.streams = nil
}
