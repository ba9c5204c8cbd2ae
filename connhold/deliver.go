package connhold

import (
	"time"

	"github.com/lchat/lchat-caddy/internal/safego"
)

// pendingMsg is one event kept for the instance: undelivered, or acknowledged and waiting
// for a checkpoint that started after its acknowledgement.
type pendingMsg struct {
	seq        uint64
	kind       Kind
	payload    []byte
	closeCode  int
	redelivery bool
	acked      bool
	stamp      uint64    // the space's ackClock at the acknowledgement
	ackAt      time.Time // when it was acknowledged (monotonic)
}

// queueEvent appends an event in sequence order and starts a delivery if none runs. A
// client message past the pending caps closes the connection with 1013; the close event
// itself is always queued.
func (c *Conn) queueEvent(kind Kind, payload []byte, code int) (int, string) {
	h := c.h
	c.mu.Lock()
	if kind == KindClose {
		if c.closeQueued {
			c.mu.Unlock()
			return 0, ""
		}
		c.closeQueued = true
	} else if len(c.pending)+1 > h.lim.MaxPending || c.pendBytes+len(payload) > h.lim.MaxPendingBytes ||
		h.pendingBytes.Load()+int64(len(payload)) > h.lim.MaxBoxPendingBytes {
		c.mu.Unlock()
		h.st.overflows.Add(1)
		return CloseTryAgainLater, "too many pending messages"
	}
	c.nextSeq++
	c.pending = append(c.pending, &pendingMsg{seq: c.nextSeq, kind: kind, payload: payload, closeCode: code})
	c.pendBytes += len(payload)
	h.pendingBytes.Add(int64(len(payload)))
	c.startDeliveryLocked()
	c.mu.Unlock()
	return 0, ""
}

func (c *Conn) startDeliveryLocked() {
	if c.delivering {
		return
	}
	c.delivering = true
	safego.Go(&c.h.wg, c.h.log, "connhold delivery", c.deliverLoop)
}

// nextLocked is the first event not acknowledged, in sequence order.
func (c *Conn) nextLocked() *pendingMsg {
	for _, m := range c.pending {
		if !m.acked {
			return m
		}
	}
	return nil
}

// deliverLoop delivers the connection's events one at a time, in order, until none is
// left unacknowledged. A failed delivery is tried again after a backoff, as a redelivery;
// after MaxAttempts failures in a row the connection is closed with 1011 and its events
// dropped.
func (c *Conn) deliverLoop() {
	h := c.h
	attempts := 0
	for {
		c.mu.Lock()
		m := c.nextLocked()
		if m == nil || h.ctx.Err() != nil {
			c.delivering = false
			c.mu.Unlock()
			c.maybeDone()
			return
		}
		ev := Event{Space: c.space, ConnID: c.id, Seq: m.seq, Kind: m.kind, Payload: m.payload,
			CloseCode: m.closeCode, Redelivery: m.redelivery, Tags: c.tags, Meta: c.meta}
		c.mu.Unlock()

		reply, err := h.d.Deliver(h.ctx, ev)
		if err != nil {
			if h.ctx.Err() != nil {
				continue
			}
			h.st.deliveryErrors.Add(1)
			c.mu.Lock()
			m.redelivery = true
			c.mu.Unlock()
			attempts++
			if attempts >= h.lim.MaxAttempts {
				h.log.Warn("instance kept refusing a connection's event; closing it")
				c.closeWith(CloseInternal, "instance unavailable")
				c.dropAll()
				continue
			}
			select {
			case <-h.ctx.Done():
			case <-time.After(backoff(h.lim, attempts)):
			}
			continue
		}
		attempts = 0
		if ev.Redelivery {
			h.st.redelivered.Add(1)
		}
		h.st.delivered.Add(1)
		stamp, ask := h.acked(c.space, c)
		c.mu.Lock()
		m.acked, m.stamp, m.ackAt = true, stamp, time.Now()
		c.applyLocked(reply)
		c.mu.Unlock()
		c.sendReply(reply, true)
		if ask && h.NeedCheckpoint != nil {
			h.NeedCheckpoint(c.space)
		}
	}
}

func backoff(l Limits, attempts int) time.Duration {
	d := l.RetryFirst
	for i := 1; i < attempts && d < l.RetryMax; i++ {
		d *= 2
	}
	return min(d, l.RetryMax)
}

// acked stamps an acknowledgement on space's clock, and reports whether to ask for a
// checkpoint: c's acknowledged-but-uncovered backlog passed half its caps.
func (h *Hub) acked(space string, c *Conn) (uint64, bool) {
	c.mu.Lock()
	n, bytes := 0, 0
	for _, m := range c.pending {
		if m.acked {
			n++
			bytes += len(m.payload)
		}
	}
	c.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	sc := h.spaces[space]
	if sc == nil {
		return 0, false
	}
	sc.ackClock++
	ask := !sc.askedCheckpoint && (2*(n+1) > h.lim.MaxPending || 2*bytes > h.lim.MaxPendingBytes)
	if ask {
		sc.askedCheckpoint = true
	}
	return sc.ackClock, ask
}

// applyLocked applies an answer's changes to the connection.
func (c *Conn) applyLocked(r Reply) {
	if r.SetTags != nil {
		c.tags = *r.SetTags
	}
	if r.SetMeta != nil {
		c.meta = *r.SetMeta
	}
	if r.AutoRequest != "" {
		c.autoReq, c.autoResp = r.AutoRequest, r.AutoResponse
	}
}

// sendReply sends an answer's messages, then its close; inline as for enqueue.
func (c *Conn) sendReply(r Reply, inline bool) {
	for _, m := range r.Messages {
		c.send(m, inline)
	}
	if r.CloseCode != 0 {
		c.closeWith(r.CloseCode, r.CloseReason)
	}
}

// dropAll forgets every pending event (the instance would not take them).
func (c *Conn) dropAll() {
	c.mu.Lock()
	c.h.pendingBytes.Add(-int64(c.pendBytes))
	c.pending, c.pendBytes = nil, 0
	c.mu.Unlock()
}

// maybeDone removes a connection whose socket is gone and whose events are all covered.
func (c *Conn) maybeDone() {
	c.mu.Lock()
	done := c.state == stateGone && len(c.pending) == 0 && !c.delivering && c.setStateLocked(stateDone)
	c.mu.Unlock()
	if done {
		c.h.forget(c)
	}
}

// Mark is a point on a space's acknowledgement clock: a checkpoint's start.
type Mark uint64

// CheckpointStarted is called by the engine as a checkpoint of space begins; what the
// instance acknowledged before it is in the state the checkpoint saves.
func (h *Hub) CheckpointStarted(space string) Mark {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sc := h.spaces[space]; sc != nil {
		return Mark(sc.ackClock)
	}
	return 0
}

// CheckpointDone is called once the checkpoint that started at m has completed: the
// messages acknowledged before m are saved with the space, and dropped.
func (h *Hub) CheckpointDone(space string, m Mark) {
	h.dropAcked(space, func(pm *pendingMsg) bool { return pm.stamp <= uint64(m) })
}

// dropAcked drops space's acknowledged messages that covered says a checkpoint saved.
func (h *Hub) dropAcked(space string, covered func(*pendingMsg) bool) {
	h.mu.Lock()
	if sc := h.spaces[space]; sc != nil {
		sc.askedCheckpoint = false
	}
	h.mu.Unlock()
	for _, c := range h.spaceConnsOf(space) {
		c.mu.Lock()
		kept := c.pending[:0]
		for _, pm := range c.pending {
			if pm.acked && covered(pm) {
				c.pendBytes -= len(pm.payload)
				h.pendingBytes.Add(-int64(len(pm.payload)))
				continue
			}
			kept = append(kept, pm)
		}
		clear(c.pending[len(kept):])
		c.pending = kept
		c.mu.Unlock()
		c.maybeDone()
	}
}

// CheckpointCovered is CheckpointDone for an engine that reports a checkpoint when it has
// completed, with the time it started: messages acknowledged before started are dropped.
// started must not be later than the checkpoint's real start (an observer subtracts a
// margin), or a message acknowledged just after it could be dropped unsaved.
func (h *Hub) CheckpointCovered(space string, started time.Time) {
	h.dropAcked(space, func(pm *pendingMsg) bool { return pm.ackAt.Before(started) })
}

// InstanceGone is called by the engine when space's instance has ended (stopped or
// crashed) after its last checkpoint bookkeeping: every message acknowledged but not
// covered by a completed checkpoint is delivered again to the next instance, marked as a
// redelivery, with its sequence number; the next delivery wakes the space.
func (h *Hub) InstanceGone(space string) {
	for _, c := range h.spaceConnsOf(space) {
		c.mu.Lock()
		n := 0
		for _, pm := range c.pending {
			if pm.acked {
				pm.acked, pm.redelivery = false, true
				n++
			}
		}
		if n > 0 {
			c.startDeliveryLocked()
		}
		c.mu.Unlock()
	}
}
