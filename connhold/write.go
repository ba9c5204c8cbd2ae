package connhold

import (
	"bytes"
	"context"
	"net"
	"time"

	"github.com/gobwas/ws"
)

// slowReaderGrace bounds how long a client cut as a slow reader is given to take the
// write in progress and the 1008 close frame before its socket ends.
const slowReaderGrace = time.Second

// serverFrame is one unmasked, unfragmented frame.
func serverFrame(op ws.OpCode, payload []byte) []byte {
	var b bytes.Buffer
	b.Grow(ws.MaxHeaderSize + len(payload))
	ws.WriteHeader(&b, ws.Header{Fin: true, OpCode: op, Length: int64(len(payload))})
	b.Write(payload)
	return b.Bytes()
}

func closeFrame(code int, reason string) []byte {
	return serverFrame(ws.OpClose, ws.NewCloseFrameBody(ws.StatusCode(code), reason))
}

// send queues m for the client; inline as for enqueue.
func (c *Conn) send(m Message, inline bool) bool {
	op := ws.OpText
	if m.Binary {
		op = ws.OpBinary
	}
	return c.enqueue(serverFrame(op, m.Payload), inline)
}

// enqueue queues one frame for the client and starts a writer if none runs (inline: writes
// it on this goroutine).
//
// The per-client cap counts what the client has not read behind the write in progress:
// the bytes queued that no write has taken yet (a pong aside: see pong). A frame that
// would take them past MaxOutBytes (or the box's bytes towards all clients past
// MaxBoxOutBytes) makes the client a slow reader: its queue is dropped and it is closed
// with 1008, so it cannot make the box hold more. A frame is never refused for its own
// size: one with nothing queued before it passes whatever its length, so a message of the
// largest size reaches a client that reads, and what the box holds for a client is the
// write in progress plus at most MaxOutBytes (or one larger frame). inline (the
// connection's own delivery sending an answer) waits for the writer to take what is
// queued instead of refusing: the next event waits for the client, which is cut if it
// takes no bytes for WriteTimeout.
func (c *Conn) enqueue(frame []byte, inline bool) bool {
	h := c.h
	c.mu.Lock()
	for inline && c.state == stateOpen && c.writing && c.overCapLocked(len(frame)) {
		c.room.Wait()
	}
	if c.state != stateOpen {
		c.mu.Unlock()
		return false
	}
	if c.overCapLocked(len(frame)) || h.outBytes.Load()+int64(len(frame)) > h.lim.MaxBoxOutBytes {
		c.dropOutLocked()
		c.closeLocked(ClosePolicy, ClosePolicy, "slow reader")
		// The write in progress is what this client does not read: it and the close frame
		// get slowReaderGrace, not WriteTimeout, so the socket and the instance's close
		// event do not wait on a client that has stopped reading.
		c.cutBy = time.Now().Add(min(slowReaderGrace, h.lim.WriteTimeout))
		c.nc.SetWriteDeadline(c.cutBy)
		c.mu.Unlock()
		return false
	}
	c.queueLocked(frame)
	if c.writing {
		c.mu.Unlock()
		return true
	}
	if !inline {
		c.startWriterLocked()
		c.mu.Unlock()
		return true
	}
	// inline (the connection's own delivery sending an answer): this goroutine writes
	// itself, saving a goroutine hand-off per message. A client slow to take the bytes
	// holds up only its own deliveries, up to WriteTimeout, then is cut. The frame is
	// this write's from now on: not queued behind it.
	c.writing, c.queued = true, 0
	c.mu.Unlock()
	c.writeLoop()
	return true
}

// pong queues the answer to a client's ping. It is not counted against the slow-reader
// cap: a connection has at most one pong queued (a later ping's replaces it, as RFC 6455
// section 5.5.3 allows), so a client's pings cannot make the box hold more, and a client
// that pings while a large message is written to it is not taken for a slow reader.
func (c *Conn) pong(payload []byte) {
	frame := serverFrame(ws.OpPong, payload)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != stateOpen {
		return
	}
	if c.pongAt > 0 {
		delta := len(frame) - len(c.outq[c.pongAt-1])
		c.outq[c.pongAt-1] = frame
		c.outBytes += delta
		c.h.outBytes.Add(int64(delta))
		return
	}
	c.outq = append(c.outq, frame)
	c.pongAt = len(c.outq)
	c.outBytes += len(frame)
	c.h.outBytes.Add(int64(len(frame)))
	c.startWriterLocked()
}

// overCapLocked reports whether n more bytes queued would make the client a slow reader:
// something is queued already, and the two pass MaxOutBytes.
func (c *Conn) overCapLocked(n int) bool {
	return c.queued > 0 && c.queued+n > c.h.lim.MaxOutBytes
}

// queueLocked appends frame to the queue and counts it.
func (c *Conn) queueLocked(frame []byte) {
	c.outq = append(c.outq, frame)
	c.outBytes += len(frame)
	c.queued += len(frame)
	c.h.outBytes.Add(int64(len(frame)))
}

func (c *Conn) dropOutLocked() {
	c.h.outBytes.Add(-int64(c.outBytes))
	c.outq, c.outBytes, c.queued, c.pongAt = nil, 0, 0, 0
	c.room.Broadcast()
}

func (c *Conn) startWriterLocked() {
	if c.writing {
		return
	}
	c.writing = true
	c.h.wg.Add(1)
	go func() {
		defer c.h.wg.Done()
		c.writeLoop()
	}()
}

// writeLoop writes the queue until it is empty, then ends (an idle connection has no
// writer). A close frame queued last ends the socket once written.
func (c *Conn) writeLoop() {
	h := c.h
	for {
		c.mu.Lock()
		if len(c.outq) == 0 || c.state == stateGone {
			c.writing = false
			end := c.closeAfter && c.state == stateClosing
			code, why := c.closeCode, c.closeWhy
			c.mu.Unlock()
			if end {
				c.abort(code, why)
			}
			return
		}
		batch := net.Buffers(c.outq)
		var n int
		for _, f := range c.outq {
			n += len(f)
		}
		c.outq, c.queued, c.pongAt = nil, 0, 0
		c.room.Broadcast()
		deadline := time.Now().Add(h.lim.WriteTimeout)
		if !c.cutBy.IsZero() && c.cutBy.Before(deadline) {
			deadline = c.cutBy
		}
		c.mu.Unlock()
		c.nc.SetWriteDeadline(deadline)
		_, err := batch.WriteTo(c.nc)
		c.mu.Lock()
		c.outBytes -= n
		c.mu.Unlock()
		h.outBytes.Add(-int64(n))
		if err != nil {
			c.mu.Lock()
			c.writing = false
			code, why := c.closeCode, c.closeWhy
			c.mu.Unlock()
			if code == 0 {
				code, why = CloseAbnormal, "write failed"
			}
			c.abort(code, why)
			return
		}
	}
}

// closeWith closes the connection from the box's side: the close frame goes after what is
// queued, then the socket ends; the instance's close event carries code and why.
func (c *Conn) closeWith(code int, why string) {
	c.mu.Lock()
	c.closeLocked(code, code, why)
	c.mu.Unlock()
}

// closeWithEvent answers a client's close: echo is sent, the event reports the client's
// code and reason.
func (c *Conn) closeWithEvent(echo, code int, reason string) {
	c.mu.Lock()
	c.closeLocked(echo, code, reason)
	c.mu.Unlock()
}

func (c *Conn) closeLocked(send, evCode int, evWhy string) {
	if !c.setStateLocked(stateClosing) {
		return
	}
	c.closeCode, c.closeWhy = evCode, evWhy
	c.h.st.closed(send)
	c.queueLocked(closeFrame(send, ""))
	c.closeAfter = true
	c.startWriterLocked()
}

// abort ends the socket now: out of the poller, closed, the queue dropped; the instance
// gets a close event with code (the box's close code when it was closing). Idempotent.
func (c *Conn) abort(code int, why string) {
	h := c.h
	c.mu.Lock()
	if c.state == stateClosing {
		code, why = c.closeCode, c.closeWhy
	}
	if !c.setStateLocked(stateGone) {
		c.mu.Unlock()
		return
	}
	c.dropOutLocked()
	wasParked := c.parked
	c.parked = false
	c.mu.Unlock()
	if wasParked {
		h.st.parked.Add(-1)
		c.releaseInBuf() // no reader runs: its partial frame goes with the socket
		c.rbuf = nil
	}
	h.poll.remove(c)
	c.nc.Close()
	h.st.held.Add(-1)
	c.queueEvent(KindClose, []byte(why), code)
}

// waitGone waits until the socket has ended or ctx ends.
// It waits on room, which every change of state signals (setStateLocked).
func (c *Conn) waitGone(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.room.Broadcast()
		c.mu.Unlock()
	})
	defer stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.state < stateGone && ctx.Err() == nil {
		c.room.Wait()
	}
}
