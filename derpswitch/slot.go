package derpswitch

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lchat/lchat-caddy/internal/backoff"
	"github.com/lchat/lchat-caddy/internal/safego"
	"go.uber.org/zap"
	"tailscale.com/derp"
	"tailscale.com/types/key"
)

// Slot roles.
const (
	RoleHome     = "home"
	RoleAux      = "aux"
	RoleDraining = "draining"
)

// reconnectBackoff spaces a slot's reconnects after its connection broke (recvLoop): the
// first is immediate, so a flushed home is back as fast as the handshake allows; refused
// ones then wait 50ms, doubling to 5s. It runs on real time, as it races real sockets.
var reconnectBackoff = backoff.Curve{First: 50 * time.Millisecond, Max: 5 * time.Second, Free: 1}

// slot is one connection to one region.
type slot struct {
	sw     *Switcher
	region int
	conn   Conn

	// role and drainUntil are written by the executor only; role is read by Status.
	role       atomic.Value // string
	drainUntil time.Time

	connected atomic.Bool // written by the slot's recv loop (and the op that connects it)
	closed    atomic.Bool
	recvOnce  sync.Once

	// rxPackets and rxEchoes count packets relayed to us on this connection (echo
	// requests among them); rxCh signals each one. Written by the recv loop, read by
	// the prove step: traffic received on an aux proves the region relays to us.
	rxPackets, rxEchoes atomic.Uint64
	rxCh                chan struct{}
}

func (sl *slot) noteRx(echo bool) {
	sl.rxPackets.Add(1)
	if echo {
		sl.rxEchoes.Add(1)
	}
	poke(sl.rxCh)
}

func (s *slot) getRole() string { r, _ := s.role.Load().(string); return r }

func (s *Switcher) newSlot(region int, role string) *slot {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	sl := &slot{sw: s, region: region, conn: s.dial(s.regionFunc(region)), rxCh: make(chan struct{}, 1)}
	sl.role.Store(role)
	s.slots = append(s.slots, sl)
	return sl
}

func (s *Switcher) removeSlot(sl *slot) {
	s.stMu.Lock()
	for i, x := range s.slots {
		if x == sl {
			s.slots = append(s.slots[:i:i], s.slots[i+1:]...)
			break
		}
	}
	s.stMu.Unlock()
	sl.close()
}

func (sl *slot) close() {
	if sl.closed.Swap(true) {
		return
	}
	sl.connected.Store(false)
	sl.conn.Close()
}

// startRecv starts the slot's receive loop once. The loop reconnects implicitly
// (derphttp) when the connection breaks, until the slot is closed.
func (sl *slot) startRecv() {
	sl.recvOnce.Do(func() {
		safego.Go(&sl.sw.recvWG, sl.sw.logger(), "recv loop", sl.recvLoop)
	})
}

func (sl *slot) recvLoop() {
	s := sl.sw
	lastGen := 0
	fails := 0 // receives failed in a row: the count reconnectBackoff follows
	var lostAt time.Time
	for {
		if sl.closed.Load() || s.ctx.Err() != nil {
			return
		}
		m, gen, err := sl.conn.RecvDetail()
		if err != nil {
			if sl.closed.Load() || s.ctx.Err() != nil {
				return
			}
			wasUp := sl.connected.Swap(false)
			if wasUp {
				lostAt = time.Now()
				if s.homePtr.Load() == sl {
					// The flush path: the home is reconnected in place (derphttp's next
					// Recv dials the same region); it is never moved to an unproven region.
					s.logger().Warn("DERP reconnect requested (home connection lost; reconnecting in place)",
						zap.Int("region", sl.region), zap.Int("override", s.Override()), zap.Error(err))
					poke(s.pokeCh)
				}
			}
			fails++
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(reconnectBackoff.After(fails)):
			}
			continue
		}
		fails = 0
		if gen != lastGen {
			if lastGen != 0 && s.homePtr.Load() == sl {
				s.ctr.derpReconnects.Add(1)
				fields := []zap.Field{zap.Int("region", sl.region), zap.Int("conn_gen", gen)}
				if !lostAt.IsZero() {
					fields = append(fields, zap.Duration("down_for", time.Since(lostAt)))
				}
				s.logger().Info("home DERP connection re-established", fields...)
			}
			lastGen = gen
			if !sl.connected.Swap(true) && s.homePtr.Load() == sl {
				poke(s.pokeCh)
			}
		}
		switch m := m.(type) {
		case derp.ReceivedPacket:
			sl.noteRx(s.isEcho(m.Data))
			s.handlePacket(m.Source, m.Data)
		case derp.PingMessage:
			sl.conn.SendPong(m)
		}
	}
}

// isEcho reports whether data is an echo request.
func (s *Switcher) isEcho(data []byte) bool {
	s.cfgMu.Lock()
	prefix := s.cfg.EchoPrefix
	s.cfgMu.Unlock()
	return len(prefix) > 0 && bytes.HasPrefix(data, prefix)
}

// handlePacket answers echo requests through the home connection, whichever slot
// received them.
func (s *Switcher) handlePacket(src key.NodePublic, data []byte) {
	s.cfgMu.Lock()
	prefix, reply := s.cfg.EchoPrefix, s.cfg.EchoReplyPrefix
	s.cfgMu.Unlock()
	if len(prefix) == 0 || !bytes.HasPrefix(data, prefix) {
		return
	}
	home := s.homePtr.Load()
	if home == nil || !home.connected.Load() {
		return
	}
	out := make([]byte, 0, len(reply)+len(data)-len(prefix))
	out = append(append(out, reply...), data[len(prefix):]...)
	if err := home.conn.Send(src, out); err == nil {
		s.ctr.echoReplies.Add(1)
	}
}
