package held

import (
	"sync"
	"time"

	"github.com/lchat/lchat-caddy/internal/backoff"
)

// peerDownBackoff: after n consecutive failed answers from a peer (its part of a control
// call, or a probe of it, ended without an answer: a timeout, a refused or reset
// connection), the fan-out does not wait for it again before peerDownBackoff.After(n):
// 1s, 2s, 4s ... 30s; then one probe, in the background, decides.
var peerDownBackoff = backoff.Curve{First: time.Second, Max: 30 * time.Second}

// peerSkips is which peers a control call's fan-out waits for. A peer whose part ended
// without an answer (partitioned from this box, frozen, or dead and not yet counted so by
// its heartbeat) would hold every send of every space here for peerControlTimeout; once
// one part failed, it is down: the fan-out leaves it out (what it holds of the call's
// connections misses the call, as it would have after the timeout) until its backoff
// passes, then probes it in the background with a call that changes nothing, one probe at
// a time, while still leaving it out. A probe or a part that gets an answer (any status)
// brings it back. The zero value is ready; it is safe for concurrent use.
type peerSkips struct {
	mu   sync.Mutex
	down map[string]*downPeer
}

// downPeer is one peer that did not answer.
type downPeer struct {
	fails   int       // consecutive parts and probes without an answer
	next    time.Time // when it may be probed
	probing bool      // a probe is out
}

// plan splits peers at now into those a call waits for and those it leaves out, and
// names the ones among the left-out to probe now (each then marked probing until its
// outcome is recorded).
func (s *peerSkips) plan(peers []string, now time.Time) (call, probe []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range peers {
		d := s.down[p]
		switch {
		case d == nil:
			call = append(call, p)
		case !d.probing && !now.Before(d.next):
			d.probing = true
			probe = append(probe, p)
		}
	}
	return call, probe
}

// failed records that peer did not answer at now (a part or a probe) and reports whether
// it was up until then.
func (s *peerSkips) failed(peer string, now time.Time) (wasUp bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down == nil {
		s.down = make(map[string]*downPeer)
	}
	d := s.down[peer]
	if d == nil {
		d = &downPeer{}
		s.down[peer] = d
	}
	d.fails++
	d.probing = false
	d.next = now.Add(peerDownBackoff.After(d.fails))
	return d.fails == 1
}

// answered records that peer answered (a part or a probe) and reports whether it was down.
func (s *peerSkips) answered(peer string) (wasDown bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, wasDown = s.down[peer]
	delete(s.down, peer)
	return wasDown
}
