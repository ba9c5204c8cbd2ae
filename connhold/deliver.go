package connhold

import (
	"errors"
	"slices"
	"time"

	"github.com/lchat/lchat-caddy/internal/backoff"
	"github.com/lchat/lchat-caddy/internal/safego"
)

// redeliveryBackoff spaces the deliveries of an event the instance did not acknowledge
// (deliverLoop): 100ms after the first failure, doubling to 5s, until MaxAttempts
// failures in a row close the connection. Limits.RetryFirst and RetryMax replace its
// First and Max (Limits.redelivery).
var redeliveryBackoff = backoff.Curve{First: 100 * time.Millisecond, Max: 5 * time.Second}

// pendingMsg is one event kept for the instance: undelivered, or acknowledged and waiting
// for a checkpoint that started after its acknowledgement.
type pendingMsg struct {
	seq        uint64
	kind       Kind
	payload    []byte
	closeCode  int
	redelivery bool
	acked      bool
	stamp      uint64    // the space's ackClock at the acknowledgement; remote: the mark on the other box's Relay
	ackAt      time.Time // when it was acknowledged (monotonic)
	at         At        // the instance that acknowledged it
	remote     bool      // at is on another box: only its Notices cover it
	dropped    bool      // no longer in pending (dropAll): an acknowledgement changes nothing
}

// priorCount is one instance that acknowledged n of a connection's pending messages.
type priorCount struct {
	at At
	n  int
}

// ackLocked marks m acknowledged by at and counts it.
func (c *Conn) ackLocked(m *pendingMsg, at At) {
	m.acked, m.at = true, at
	c.ackedN++
	c.ackedBytes += len(m.payload)
	if at.IsZero() {
		return
	}
	for i := range c.priors {
		if c.priors[i].at == at {
			c.priors[i].n++
			return
		}
	}
	c.priors = append(c.priors, priorCount{at: at, n: 1})
}

// unackLocked takes m's acknowledgement out of the counts: m is delivered again, or
// dropped. The caller changes m.acked (or drops m).
func (c *Conn) unackLocked(m *pendingMsg) {
	c.ackedN--
	c.ackedBytes -= len(m.payload)
	if m.at.IsZero() {
		return
	}
	for i := range c.priors {
		if c.priors[i].at == m.at {
			if c.priors[i].n--; c.priors[i].n == 0 {
				c.priors = slices.Delete(c.priors, i, i+1)
			}
			return
		}
	}
}

// queueEvent appends an event in sequence order and starts a delivery if none runs. A
// client message past the pending caps closes the connection with 1013; the close event
// itself is always queued.
func (c *Conn) queueEvent(kind Kind, payload []byte, code int) (int, string) {
	return c.queue(kind, payload, code, false)
}

// queue is queueEvent; byReader (the connection's reader, with a client message) has the
// reader run the delivery itself when none runs (readLoop), instead of a new goroutine.
func (c *Conn) queue(kind Kind, payload []byte, code int, byReader bool) (int, string) {
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
	if byReader && !c.delivering {
		c.delivering, c.readerDelivers = true, true
	} else {
		c.startDeliveryLocked()
	}
	c.mu.Unlock()
	return 0, ""
}

// takeReaderDelivery reports whether the reader owes a delivery run, and clears it.
func (c *Conn) takeReaderDelivery() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	owed := c.readerDelivers
	c.readerDelivers = false
	return owed
}

func (c *Conn) startDeliveryLocked() {
	if c.delivering {
		return
	}
	c.delivering = true
	safego.Go(&c.h.wg, c.h.log, "connhold delivery", c.deliverLoop)
}

// nextLocked is the first event not acknowledged, in sequence order. Every message
// below c.scan is acknowledged: acknowledgements go in order, and whatever takes one
// back (replay) or moves the messages (dropAcked) starts the scan over.
func (c *Conn) nextLocked() *pendingMsg {
	for c.scan < len(c.pending) && c.pending[c.scan].acked {
		c.scan++
	}
	if c.scan < len(c.pending) {
		return c.pending[c.scan]
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
			CloseCode: m.closeCode, Redelivery: m.redelivery, Tags: c.tags, Meta: c.meta, Prior: c.priorLocked()}
		c.mu.Unlock()

		reply, err := h.d.Deliver(h.ctx, ev)
		if re, ok := IsReplay(err); ok {
			// Not delivered: the messages the earlier instances acknowledged go first.
			c.replay(func(pm *pendingMsg) bool { return slices.Contains(re.Stale, pm.at) })
			continue
		}
		if err != nil {
			if h.ctx.Err() != nil {
				continue
			}
			h.st.deliveryErrors.Add(1)
			if !errors.Is(err, ErrNotDelivered) {
				c.mu.Lock()
				m.redelivery = true
				c.mu.Unlock()
			}
			attempts++
			if attempts >= h.lim.MaxAttempts {
				h.log.Warn("instance kept refusing a connection's event; closing it")
				c.closeWith(CloseInternal, "instance unavailable")
				c.dropAll()
				continue
			}
			select {
			case <-h.ctx.Done():
			case <-time.After(h.lim.redelivery().After(attempts)):
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
		if !m.dropped {
			m.stamp, m.ackAt = stamp, time.Now()
			if reply.Mark != 0 {
				m.stamp, m.remote = reply.Mark, true
			}
			c.ackLocked(m, reply.At)
		}
		c.applyLocked(reply)
		c.mu.Unlock()
		c.sendReply(reply, true)
		if reply.Durable {
			h.dropAcked(c.space, func(pm *pendingMsg) bool { return pm == m })
		}
		if reply.Mark != 0 && reply.Covered != 0 {
			h.RemoteCovered(c.space, reply.At, reply.Covered)
		}
		if ask && h.NeedCheckpoint != nil {
			h.NeedCheckpoint(c.space, reply.At)
		}
	}
}

// priorLocked is where c's acknowledged messages that no checkpoint is known to hold
// were acknowledged (Event.Prior).
func (c *Conn) priorLocked() []At {
	if len(c.priors) == 0 {
		return nil
	}
	out := make([]At, len(c.priors))
	for i, p := range c.priors {
		out[i] = p.at
	}
	return out
}

// replay makes c's acknowledged messages that match undelivered again, marked as
// redeliveries, and starts a delivery: the next one goes to whichever instance now runs
// the space, before any later message.
func (c *Conn) replay(match func(*pendingMsg) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, pm := range c.pending {
		if pm.acked && match(pm) {
			c.unackLocked(pm)
			pm.acked, pm.redelivery, pm.remote = false, true, false
			n++
		}
	}
	if n > 0 {
		c.scan = 0
		c.h.st.replays.Add(uint64(n))
		c.startDeliveryLocked()
	}
	return n
}

// redelivery is the curve of l's redeliveries: redeliveryBackoff, with RetryFirst and
// RetryMax in place of its First and Max where they are set.
func (l Limits) redelivery() backoff.Curve {
	c := redeliveryBackoff
	if l.RetryFirst > 0 {
		c.First = l.RetryFirst
	}
	if l.RetryMax > 0 {
		c.Max = l.RetryMax
	}
	return c
}

// acked stamps an acknowledgement on space's clock, and reports whether to ask for a
// checkpoint: c's acknowledged-but-uncovered backlog passed half its caps.
func (h *Hub) acked(space string, c *Conn) (uint64, bool) {
	c.mu.Lock()
	n, bytes := c.ackedN, c.ackedBytes
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
	for _, pm := range c.pending {
		pm.dropped = true
	}
	c.pending, c.pendBytes = nil, 0
	c.ackedN, c.ackedBytes, c.priors, c.scan = 0, 0, nil, 0
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
	h.dropAcked(space, func(pm *pendingMsg) bool { return !pm.remote && pm.stamp <= uint64(m) })
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
				c.unackLocked(pm)
				pm.dropped = true
				c.pendBytes -= len(pm.payload)
				h.pendingBytes.Add(-int64(len(pm.payload)))
				continue
			}
			kept = append(kept, pm)
		}
		clear(c.pending[len(kept):])
		c.pending, c.scan = kept, 0
		c.mu.Unlock()
		c.maybeDone()
	}
}

// CheckpointCovered is CheckpointDone for an engine that reports a checkpoint when it has
// completed, with the time it started: messages acknowledged before started are dropped.
// started must not be later than the checkpoint's real start (the engine stamps it
// before it reads a file), or a message acknowledged just after it could be dropped
// unsaved.
func (h *Hub) CheckpointCovered(space string, started time.Time) {
	h.dropAcked(space, func(pm *pendingMsg) bool { return !pm.remote && pm.ackAt.Before(started) })
}

// InstanceGone is called by the engine when space's instance has ended (stopped or
// crashed) after its last checkpoint bookkeeping: every message acknowledged but not
// covered by a completed checkpoint is delivered again to the next instance, marked as a
// redelivery, with its sequence number; the next delivery wakes the space.
func (h *Hub) InstanceGone(space string) {
	for _, c := range h.spaceConnsOf(space) {
		c.replay(func(pm *pendingMsg) bool { return !pm.remote })
	}
}

// RemoteCovered drops space's messages that instance at, on another box, acknowledged
// with a mark up to covered: a completed checkpoint there holds them (a Notice, or an
// answer's CoveredHeader).
func (h *Hub) RemoteCovered(space string, at At, covered uint64) {
	h.dropAcked(space, func(pm *pendingMsg) bool { return pm.remote && pm.at == at && pm.stamp <= covered })
}

// RemoteGone is RemoteCovered up to covered, and then every other message instance at
// acknowledged is delivered again: that instance ended without saving them.
func (h *Hub) RemoteGone(space string, at At, covered uint64) {
	h.RemoteCovered(space, at, covered)
	for _, c := range h.spaceConnsOf(space) {
		c.replay(func(pm *pendingMsg) bool { return pm.remote && pm.at == at })
	}
}

// BoxGone delivers again every message an instance on box (in its process incarnation)
// acknowledged and no Notice covered: that box is no longer a live member of the mesh,
// and cannot tell what its last checkpoint held.
func (h *Hub) BoxGone(box, incarnation string) int {
	n := 0
	for _, c := range h.allConns() {
		n += c.replay(func(pm *pendingMsg) bool {
			return pm.remote && pm.at.Box == box && pm.at.Incarnation == incarnation
		})
	}
	return n
}

// RemoteBoxes are the (box, incarnation) pairs of other boxes whose instances hold
// acknowledged messages of this box's connections that no Notice covered yet.
func (h *Hub) RemoteBoxes() [][2]string {
	var out [][2]string
	for _, c := range h.allConns() {
		c.mu.Lock()
		for _, pm := range c.pending {
			if k := [2]string{pm.at.Box, pm.at.Incarnation}; pm.acked && pm.remote && !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
		c.mu.Unlock()
	}
	return out
}
