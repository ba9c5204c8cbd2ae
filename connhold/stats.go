package connhold

import (
	"maps"
	"sync"
	"sync/atomic"
)

// counters are the hub's figures, for the metrics and the console.
type counters struct {
	held, parked, readers                        atomic.Int64
	pings, autoResponses, delivered, redelivered atomic.Uint64
	deliveryErrors, overflows, replays           atomic.Uint64
	streams                                      atomic.Int64 // resumable event streams held
	mu                                           sync.Mutex
	closes                                       map[int]uint64 // guarded by mu
	spaceStreams                                 map[string]int // by space; guarded by mu
}

func (c *counters) closed(code int) {
	c.mu.Lock()
	c.closes[code]++
	c.mu.Unlock()
}

// Stats is a snapshot of the hub's figures.
type Stats struct {
	// Held is connections whose socket is open; Parked those of them with no goroutine,
	// waiting in the epoll set; Readers the reader goroutines running.
	Held, Parked, Readers int64
	// Streams is the resumable event streams the box holds (StreamHeld): each the
	// response of one client's request, kept open across its space's sleeps.
	Streams int64
	// PendingBytes is client message bytes kept for instances; OutBytes bytes queued to
	// clients.
	PendingBytes, OutBytes int64
	// Pings and AutoResponses were answered by the box without an event.
	Pings, AutoResponses uint64
	// Delivered events were acknowledged (Redelivered of them as redeliveries);
	// DeliveryErrors deliveries failed; Overflows messages closed their connection
	// with 1013.
	Delivered, Redelivered, DeliveryErrors, Overflows uint64
	// Replayed messages were made undelivered again because the instance that
	// acknowledged them ended, or another now runs the space, with no checkpoint known
	// to hold them.
	Replayed uint64
	// Closes counts the close codes the box sent.
	Closes map[int]uint64
}

// Stats reads the hub's figures.
func (h *Hub) Stats() Stats {
	s := &h.st
	s.mu.Lock()
	closes := maps.Clone(s.closes)
	s.mu.Unlock()
	return Stats{
		Held: s.held.Load(), Parked: s.parked.Load(), Readers: s.readers.Load(), Streams: s.streams.Load(),
		PendingBytes: h.pendingBytes.Load(), OutBytes: h.outBytes.Load(),
		Pings: s.pings.Load(), AutoResponses: s.autoResponses.Load(),
		Delivered: s.delivered.Load(), Redelivered: s.redelivered.Load(),
		DeliveryErrors: s.deliveryErrors.Load(), Overflows: s.overflows.Load(), Replayed: s.replays.Load(),
		Closes: closes,
	}
}

// SpaceStats is one space's held connections on this box.
type SpaceStats struct {
	// Open is connections whose socket is open (a closing one included), as Stats.Held;
	// Parked those of them with no goroutine, in the epoll set.
	Open, Parked int
	// Streams is the space's resumable event streams held by the box, as Stats.Streams.
	Streams int
	// PendingBytes is the bytes of the space's client messages kept for its instances
	// (undelivered, or acknowledged and not yet covered by a checkpoint). Unlike
	// Stats.PendingBytes it leaves out messages still arriving.
	PendingBytes int64
}

// StreamHeld counts one resumable event stream of space among those the box holds, from
// its first resumable answer until the client's response ends, when the glue calls done
// (once; later calls do nothing). A held stream is a held connection as a WebSocket is:
// the client keeps it open while its space sleeps.
func (h *Hub) StreamHeld(space string) (done func()) {
	s := &h.st
	s.mu.Lock()
	if s.spaceStreams == nil {
		s.spaceStreams = make(map[string]int)
	}
	s.spaceStreams[space]++
	s.mu.Unlock()
	s.streams.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			s.streams.Add(-1)
			s.mu.Lock()
			if s.spaceStreams[space]--; s.spaceStreams[space] <= 0 {
				delete(s.spaceStreams, space)
			}
			s.mu.Unlock()
		})
	}
}

// SpaceStats reads each space's held connections, by space. A space with no connection
// or stream open and nothing pending is left out.
func (h *Hub) SpaceStats() map[string]SpaceStats {
	h.mu.Lock()
	by := make(map[string][]*Conn, len(h.spaces))
	for space, sc := range h.spaces {
		for _, c := range sc.conns {
			by[space] = append(by[space], c)
		}
	}
	h.mu.Unlock()
	h.st.mu.Lock()
	streams := maps.Clone(h.st.spaceStreams)
	h.st.mu.Unlock()
	for space := range streams {
		if _, ok := by[space]; !ok {
			by[space] = nil
		}
	}
	out := make(map[string]SpaceStats, len(by))
	for space, cs := range by {
		s := SpaceStats{Streams: streams[space]}
		for _, c := range cs {
			c.mu.Lock()
			if c.state == stateOpen || c.state == stateClosing {
				s.Open++
			}
			if c.parked {
				s.Parked++
			}
			s.PendingBytes += int64(c.pendBytes)
			c.mu.Unlock()
		}
		if s != (SpaceStats{}) {
			out[space] = s
		}
	}
	return out
}
