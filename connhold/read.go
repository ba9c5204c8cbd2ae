package connhold

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gobwas/ws"
)

// readChunk is what one read asks for; reader buffers come from a pool and go back when
// the connection parks, so a parked connection holds no read buffer.
const readChunk = 4 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, readChunk); return &b }}

// readLoop reads and handles frames until no byte has come for ParkAfter, then parks the
// connection (no goroutine until the poller sees bytes again) and returns. It also returns
// when the connection ends. One reader runs at a time.
//
// A client message that finds no delivery running is delivered by the reader itself once
// the frames buffered are handled (deliverInline): on an awake space that saves a
// goroutine hand-off per message. A delivery that takes longer than readerHandOff (a
// wake, a slow instance) gets a new reader started beside it, so pings, auto-responses
// and the caps are served as before.
func (c *Conn) readLoop() {
	h := c.h
	bp := bufPool.Get().(*[]byte)
	buf := append((*bp)[:0], c.rbuf...)
	c.rbuf = nil
	handedOff := false
	defer func() {
		if cap(buf) <= 4*readChunk {
			*bp = buf[:0]
			bufPool.Put(bp)
		}
		if handedOff {
			return // the reader's state is the new reader's
		}
		if c.takeReaderDelivery() {
			c.startDelivery() // a return below before the reader could deliver
		}
		if !c.open() {
			c.releaseInBuf()
		}
	}()
	for {
		// Handle every complete frame buffered.
		for {
			n, code, why := c.frame(buf)
			if code != 0 {
				c.fail(code, why)
				return
			}
			if n == 0 {
				break
			}
			buf = buf[:copy(buf, buf[n:])]
			if !c.open() {
				return
			}
		}
		if c.takeReaderDelivery() {
			if len(buf) > 0 || c.fragging {
				c.startDelivery() // a frame half read: it stays with this reader
			} else if handedOff = c.deliverInline(); handedOff {
				return
			}
		}
		if !c.countInBuf(len(buf) + len(c.frag)) {
			c.fail(CloseTryAgainLater, "box pending bytes full")
			return
		}
		if len(buf) == cap(buf) {
			buf = slicesGrow(buf, readChunk)
		}
		c.nc.SetReadDeadline(time.Now().Add(h.lim.ParkAfter))
		n, err := c.nc.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if n > 0 {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Nothing for ParkAfter: every byte the TLS layer had decrypted was read
			// (its buffered plaintext is returned before it waits), so the kernel's
			// readability is the whole truth about what is left. Keep a partial frame.
			c.nc.SetReadDeadline(time.Time{})
			if len(buf) > 0 {
				c.rbuf = bytes.Clone(buf)
			}
			c.park()
			return
		}
		if err != nil {
			var ne net.Error
			if errors.Is(err, io.EOF) || errors.As(err, &ne) || errors.Is(err, net.ErrClosed) {
				c.abort(CloseAbnormal, "")
			} else {
				c.abort(CloseAbnormal, err.Error())
			}
			return
		}
	}
}

// readerHandOff is how long a reader delivers before a new reader takes its place.
const readerHandOff = time.Millisecond

// deliverInline runs the connection's deliveries on the reader, with nothing of a frame
// buffered; after readerHandOff a new reader starts beside it. It reports whether that
// happened: the caller is then no longer the reader and returns.
func (c *Conn) deliverInline() (handedOff bool) {
	c.countInBuf(0)
	t := time.AfterFunc(readerHandOff, func() { c.h.startReader(c) })
	c.deliverLoop()
	return !t.Stop()
}

// startDelivery starts the delivery run the reader owed.
func (c *Conn) startDelivery() {
	c.mu.Lock()
	c.delivering = false
	c.startDeliveryLocked()
	c.mu.Unlock()
}

func slicesGrow(b []byte, n int) []byte {
	nb := make([]byte, len(b), cap(b)*2+n)
	copy(nb, b)
	return nb
}

// frame handles the first frame in buf if it is complete and returns its length (0: not
// complete yet), or a close code for a frame that breaks the protocol or the limits.
func (c *Conn) frame(buf []byte) (n int, code int, why string) {
	if len(buf) < 2 {
		return 0, 0, ""
	}
	r := bytes.NewReader(buf)
	hd, err := ws.ReadHeader(r)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return 0, 0, ""
	}
	if err != nil {
		return 0, CloseProtocolError, "bad frame header"
	}
	hl := len(buf) - r.Len()
	switch {
	case hd.Rsv != 0:
		return 0, CloseProtocolError, "reserved bits set"
	case !hd.Masked:
		return 0, CloseProtocolError, "client frame not masked"
	case hd.OpCode.IsReserved():
		return 0, CloseProtocolError, "reserved opcode"
	case hd.OpCode.IsControl() && (!hd.Fin || hd.Length > 125):
		return 0, CloseProtocolError, "bad control frame"
	case hd.OpCode == ws.OpContinuation && !c.fragging:
		return 0, CloseProtocolError, "continuation without a message"
	case hd.OpCode.IsData() && hd.OpCode != ws.OpContinuation && c.fragging:
		return 0, CloseProtocolError, "new message inside a fragmented one"
	}
	max := int64(c.h.lim.MaxMessage)
	if hd.OpCode.IsData() && (hd.Length > max || int64(len(c.frag))+hd.Length > max) {
		return 0, CloseTooBig, "message too big"
	}
	if int64(len(buf)-hl) < hd.Length {
		return 0, 0, ""
	}
	payload := buf[hl : hl+int(hd.Length)]
	ws.Cipher(payload, hd.Mask, 0)
	n = hl + int(hd.Length)
	switch hd.OpCode {
	case ws.OpPing:
		c.h.st.pings.Add(1)
		c.pong(payload)
	case ws.OpPong:
	case ws.OpClose:
		code, why := c.clientClose(payload)
		if code != 0 {
			return 0, code, why
		}
	case ws.OpText, ws.OpBinary:
		if !hd.Fin {
			c.fragging, c.fragOp = true, byte(hd.OpCode)
			c.frag = append(c.frag[:0], payload...)
			return n, 0, ""
		}
		if code, why := c.message(hd.OpCode == ws.OpBinary, bytes.Clone(payload)); code != 0 {
			return 0, code, why
		}
	case ws.OpContinuation:
		c.frag = append(c.frag, payload...)
		if hd.Fin {
			msg := c.frag
			c.frag, c.fragging = nil, false
			if code, why := c.message(ws.OpCode(c.fragOp) == ws.OpBinary, msg); code != 0 {
				return 0, code, why
			}
		}
	}
	return n, 0, ""
}

// clientClose answers the client's close frame: the box echoes its code and ends the
// socket; the instance gets a close event.
func (c *Conn) clientClose(payload []byte) (int, string) {
	if len(payload) == 1 {
		return CloseProtocolError, "close frame of one byte"
	}
	code, reason := CloseNoStatus, ""
	if len(payload) >= 2 {
		code, reason = int(binary.BigEndian.Uint16(payload)), string(payload[2:])
		if !peerCloseCode(code) {
			return CloseProtocolError, "bad close code"
		}
		if !utf8.ValidString(reason) {
			return CloseInvalidData, "close reason not UTF-8"
		}
	}
	echo := code
	if echo == CloseNoStatus {
		echo = CloseNormal
	}
	c.closeWithEvent(echo, code, reason)
	return 0, ""
}

// message handles one whole client message: an auto-response is answered here; anything
// else is queued for the instance.
func (c *Conn) message(binary bool, payload []byte) (int, string) {
	if !binary && !utf8.Valid(payload) {
		return CloseInvalidData, "text message not UTF-8"
	}
	c.mu.Lock()
	auto := !binary && c.autoReq != "" && string(payload) == c.autoReq
	resp := c.autoResp
	c.mu.Unlock()
	if auto {
		c.h.st.autoResponses.Add(1)
		c.enqueue(serverFrame(ws.OpText, []byte(resp)), false)
		return 0, ""
	}
	kind := KindText
	if binary {
		kind = KindBinary
	}
	return c.queue(kind, payload, 0, true)
}

// countInBuf accounts the bytes the reader holds of unfinished messages; false when that
// takes the box past MaxBoxPendingBytes.
func (c *Conn) countInBuf(n int) bool {
	h := c.h
	delta := n - c.inBuf
	c.inBuf = n
	total := h.pendingBytes.Add(int64(delta))
	return delta <= 0 || total <= h.lim.MaxBoxPendingBytes
}

func (c *Conn) releaseInBuf() {
	c.h.pendingBytes.Add(-int64(c.inBuf))
	c.inBuf = 0
}

// park puts the connection in the poller; a connection that cannot be parked is closed.
func (c *Conn) park() {
	c.mu.Lock()
	if c.state != stateOpen {
		c.mu.Unlock()
		return
	}
	c.parked = true
	c.mu.Unlock()
	c.h.st.parked.Add(1)
	if err := c.h.poll.park(c); err != nil {
		c.mu.Lock()
		was := c.parked
		c.parked = false
		c.mu.Unlock()
		if was {
			c.h.st.parked.Add(-1)
		}
		c.abort(CloseAbnormal, err.Error())
	}
}

func (c *Conn) open() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == stateOpen
}

// fail closes the connection for a frame that broke the protocol or a limit.
func (c *Conn) fail(code int, why string) {
	c.closeWith(code, why)
}
