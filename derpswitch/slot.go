package derpswitch

import (
	"bytes"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

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
}

func (s *slot) getRole() string { r, _ := s.role.Load().(string); return r }

func (s *Switcher) newSlot(region int, role string) *slot {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	sl := &slot{sw: s, region: region, conn: s.dial(s.regionFunc(region))}
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
		sl.sw.recvWG.Add(1)
		go func() {
			defer sl.sw.recvWG.Done()
			defer func() {
				if r := recover(); r != nil {
					sl.sw.logger().Error("panic in recv loop", zap.Any("error", r),
						zap.ByteString("stack", debug.Stack()))
				}
			}()
			sl.recvLoop()
		}()
	})
}

func (sl *slot) recvLoop() {
	s := sl.sw
	lastGen := 0
	backoff := 100 * time.Millisecond
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
			if wasUp && s.homePtr.Load() == sl {
				s.logger().Warn("home DERP connection lost", zap.Int("region", sl.region), zap.Error(err))
				poke(s.pokeCh)
			}
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if gen != lastGen {
			if lastGen != 0 && s.homePtr.Load() == sl {
				s.ctr.derpReconnects.Add(1)
				s.logger().Info("home DERP connection re-established", zap.Int("region", sl.region),
					zap.Int("conn_gen", gen))
			}
			lastGen = gen
			if !sl.connected.Swap(true) && s.homePtr.Load() == sl {
				poke(s.pokeCh)
			}
		}
		switch m := m.(type) {
		case derp.ReceivedPacket:
			s.handlePacket(m.Source, m.Data)
		case derp.PingMessage:
			sl.conn.SendPong(m)
		}
	}
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
