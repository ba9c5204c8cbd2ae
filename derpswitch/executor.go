package derpswitch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lchat/lchat-caddy/internal/safego"
	"go.uber.org/zap"
	"tailscale.com/tailcfg"
)

type op struct {
	cmd    Command
	aux    *slot
	cancel context.CancelFunc
	done   chan error
	start  time.Time
	// proof is written by the prove goroutine before it sends on done.
	proof proof
}

func (s *Switcher) setState(st string) {
	s.stMu.Lock()
	s.state = st
	s.stMu.Unlock()
}

// setHome makes sl the home slot. Executor only.
func (s *Switcher) setHome(sl *slot) {
	old := s.homePtr.Swap(sl)
	sl.role.Store(RoleHome)
	sl.conn.NotePreferred(true)
	if old != nil && old != sl {
		old.conn.NotePreferred(false)
	}
}

func (s *Switcher) runExecutor(boot int) {
	home := s.newSlot(boot, RoleHome)
	s.setHome(home)
	home.startRecv()
	s.logger().Info("boot: connecting home region", zap.Int("region", boot))

	var cur *op
	var lastGen uint64
	for {
		var drainC <-chan time.Time
		if d, ok := s.nextDrain(); ok {
			drainC = s.clock.After(d)
		}
		var opDone chan error
		if cur != nil {
			opDone = cur.done
		}
		select {
		case <-s.ctx.Done():
			if cur != nil {
				cur.cancel()
				<-cur.done
			}
			return
		case <-s.cmdCh:
			cmd := s.loadCmd()
			if cmd.Generation == lastGen {
				continue
			}
			lastGen = cmd.Generation
			if cur != nil {
				// Generation preemption: the newer command wins.
				s.abortOp(cur, "preempted by generation", cmd.Generation)
				cur = nil
			}
			cur = s.startCommand(cmd)
		case <-s.overrideCh:
			if cur != nil {
				if why := s.overrideForbids(cur.cmd); why != "" {
					s.abortOp(cur, why, 0)
					cur = nil
				}
			}
		case err := <-opDone:
			s.finishOp(cur, err)
			cur = nil
		case <-drainC:
			s.expireDrains()
		case m := <-s.mapCh:
			if s.reconcile(m, cur) {
				cur = nil
			}
		}
	}
}

func (s *Switcher) nextDrain() (time.Duration, bool) {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	var earliest time.Time
	for _, sl := range s.slots {
		if sl.getRole() == RoleDraining && (earliest.IsZero() || sl.drainUntil.Before(earliest)) {
			earliest = sl.drainUntil
		}
	}
	if earliest.IsZero() {
		return 0, false
	}
	return earliest.Sub(s.clock.Now()), true
}

func (s *Switcher) expireDrains() {
	now := s.clock.Now()
	s.stMu.Lock()
	var expired []*slot
	for _, sl := range s.slots {
		if sl.getRole() == RoleDraining && !now.Before(sl.drainUntil) {
			expired = append(expired, sl)
		}
	}
	s.stMu.Unlock()
	for _, sl := range expired {
		s.logger().Info("old home drained; closing", zap.Int("region", sl.region))
		s.removeSlot(sl)
	}
}

func (s *Switcher) report(kind outcomeKind, cmd Command) {
	select {
	case s.outcomeCh <- outcome{kind: kind, cmd: cmd}:
	case <-s.ctx.Done():
	}
}

func (s *Switcher) startCommand(cmd Command) *op {
	cfg := s.config()
	switch cmd.Kind {
	case CmdNone:
		s.setState(StateIdle)
		return nil
	case CmdRehome:
		s.rehome(cmd.Target, cmd)
		s.report(outcomeCommitted, cmd)
		return nil
	}
	home := s.homePtr.Load()
	// "Already effective" compares the LIVE home connection's region.
	if home != nil && home.region == cmd.Target && home.connected.Load() {
		s.setState(StateIdle)
		s.report(outcomeCommitted, cmd)
		return nil
	}
	// Reuse a connection to the target that is draining (or a leftover aux).
	var aux *slot
	s.stMu.Lock()
	for _, sl := range s.slots {
		if sl.region == cmd.Target && sl != home && !sl.closed.Load() {
			aux = sl
			break
		}
	}
	s.stMu.Unlock()
	if aux == nil {
		aux = s.newSlot(cmd.Target, RoleAux)
	} else {
		aux.role.Store(RoleAux)
	}
	from := 0
	if home != nil {
		from = home.region
	}
	s.setState(StateAuxOpening)
	s.logger().Info("MBB AUX_OPENING", zap.Int("from_region", from), zap.Int("target_region", cmd.Target),
		zap.Uint64("generation", cmd.Generation), zap.String("source", cmd.Source))
	ctx, cancel := context.WithCancel(s.ctx)
	o := &op{cmd: cmd, aux: aux, cancel: cancel, done: make(chan error, 1), start: time.Now()}
	prove := cfg.Prove
	go func() {
		err := errors.New("prove panicked")
		safego.Run(s.logger(), "prove aux", func() { err = s.proveAux(ctx, aux, prove, &o.proof) })
		o.done <- err
	}()
	return o
}

// proof is what proved an aux connection: one unit per prove round.
type proof struct {
	pongs, echoes, rx int
}

func (p proof) total() int { return p.pongs + p.echoes + p.rx }

func (p proof) fields() []zap.Field {
	return []zap.Field{zap.Int("proof_pongs", p.pongs), zap.Int("proof_echoes", p.echoes), zap.Int("proof_rx", p.rx)}
}

// proveAux opens aux and proves it, as the design's "rx echo / PONG": prove.Count
// rounds, each passed by a pong to our ping or by a packet relayed to us on aux
// during the round (an echo request, or any other traffic: either shows the region
// delivers to this node). It runs on its own goroutine and touches only aux's
// connection; pr is read by the executor after done.
func (s *Switcher) proveAux(ctx context.Context, aux *slot, p ProveConfig, pr *proof) error {
	cctx, cancel := context.WithTimeout(ctx, p.ConnectTimeout)
	err := aux.conn.Connect(cctx)
	cancel()
	if err != nil {
		return fmt.Errorf("opening aux: %w", err)
	}
	aux.connected.Store(true)
	aux.startRecv()
	s.setState(StateProving)
	for round := 1; pr.total() < p.Count; round++ {
		if round > 1 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(p.Interval):
			}
		}
		rx0, echo0 := aux.rxPackets.Load(), aux.rxEchoes.Load()
		pctx, cancel := context.WithTimeout(ctx, p.Timeout)
		go func() {
			// Traffic received during the round ends it early: it is proof enough.
			for {
				select {
				case <-aux.rxCh:
					if aux.rxPackets.Load() > rx0 {
						cancel()
						return
					}
				case <-pctx.Done():
					return
				}
			}
		}()
		err := aux.conn.Ping(pctx)
		cancel()
		switch {
		case err == nil:
			pr.pongs++
		case aux.rxEchoes.Load() > echo0:
			pr.echoes++
		case aux.rxPackets.Load() > rx0:
			pr.rx++
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			return fmt.Errorf("proving aux (round %d, %d/%d proven): %w", round, pr.total(), p.Count, err)
		}
	}
	return nil
}

// abortOp cancels an in-flight op, waits for its prove goroutine and drops it.
func (s *Switcher) abortOp(o *op, why string, byGen uint64) {
	o.cancel()
	<-o.done
	s.dropOp(o, why, byGen)
}

// dropOp closes a finished op's aux connection and reports the op aborted.
func (s *Switcher) dropOp(o *op, why string, byGen uint64) {
	if o.aux != s.homePtr.Load() {
		s.removeSlot(o.aux)
	}
	s.setState(StateIdle)
	s.logger().Info("MBB aborted", zap.Int("target_region", o.cmd.Target),
		zap.Uint64("generation", o.cmd.Generation), zap.Uint64("by_generation", byGen),
		zap.String("reason", why))
	s.report(outcomeAborted, o.cmd)
}

// overrideForbids says why the current override forbids committing cmd, or "". I2':
// an override aborts a switch only if it names another region. And a switch the pin
// started dies with the pin (edge case 4): checked here, on the executor, so that a
// prove finishing before the negotiator's next pass cannot commit a cleared pin.
func (s *Switcher) overrideForbids(cmd Command) string {
	ov := int(s.override.Load())
	switch {
	case ov != 0 && ov != cmd.Target:
		return "override names another region (I2')"
	case ov == 0 && cmd.Source == "pin":
		return "pin cleared"
	}
	return ""
}

// finishOp ends an op whose prove returned err: a rollback, or the commit that makes
// the aux the home and drains the old one.
func (s *Switcher) finishOp(o *op, err error) {
	cfg := s.config()
	o.cancel()
	if why := s.overrideForbids(o.cmd); err == nil && why != "" {
		s.dropOp(o, why, 0)
		return
	}
	if err != nil {
		s.removeSlot(o.aux)
		s.ctr.rollbacks.Add(1)
		s.setState(StateIdle)
		home := s.homePtr.Load()
		homeRegion := 0
		if home != nil {
			homeRegion = home.region
		}
		s.logger().Warn("MBB ROLLBACK: target not proven; old home keeps serving",
			zap.Int("target_region", o.cmd.Target), zap.Int("home_region", homeRegion),
			zap.Uint64("generation", o.cmd.Generation), zap.String("source", o.cmd.Source),
			zap.Error(err))
		s.report(outcomeRolledBack, o.cmd)
		return
	}
	old := s.homePtr.Load()
	oldUp := old != nil && old.connected.Load()
	// Counted before the new home is visible: whoever sees the new home (Status, the
	// liveHome a caller polls) also sees its commit counted.
	s.ctr.mbbCommits.Add(1)
	if ov := int(s.override.Load()); ov != 0 && ov == o.cmd.Target {
		s.ctr.pinMBBCommits.Add(1)
	}
	s.setHome(o.aux)
	now := s.clock.Now()
	fromRegion := 0
	if old != nil && old != o.aux {
		fromRegion = old.region
		old.drainUntil = now.Add(cfg.Drain)
		old.role.Store(RoleDraining)
	}
	s.setState(StateIdle)
	s.logger().Info("MBB COMMIT (no teardown)", append([]zap.Field{zap.Int("from_region", fromRegion),
		zap.Int("target_region", o.cmd.Target), zap.Uint64("generation", o.cmd.Generation),
		zap.String("source", o.cmd.Source), zap.Bool("old_home_connected", oldUp),
		zap.Duration("took", time.Since(o.start))}, o.proof.fields()...)...)
	if cfg.OnCommit != nil {
		cfg.OnCommit(o.cmd.Target)
	}
	s.report(outcomeCommitted, o.cmd)
}

// rehome tears the home down and connects region directly (cold path, legacy mode,
// map reconcile). Executor only.
func (s *Switcher) rehome(region int, cmd Command) {
	old := s.homePtr.Load()
	s.setState(StateRehoming)
	if old != nil {
		s.homePtr.Store(nil)
		s.removeSlot(old)
	}
	// Drop any aux or draining slot to the target: the new home owns that region now.
	s.stMu.Lock()
	var drop []*slot
	for _, sl := range s.slots {
		if sl.region == region {
			drop = append(drop, sl)
		}
	}
	s.stMu.Unlock()
	for _, sl := range drop {
		s.removeSlot(sl)
	}
	home := s.newSlot(region, RoleHome)
	s.setHome(home)
	home.startRecv()
	s.ctr.rehomeApplied.Add(1)
	s.ctr.derpReconnects.Add(1)
	s.setState(StateIdle)
	oldRegion := 0
	if old != nil {
		oldRegion = old.region
	}
	s.logger().Info("DERP reconnect requested (teardown rehome)", zap.Int("from_region", oldRegion),
		zap.Int("target_region", region), zap.Uint64("generation", cmd.Generation),
		zap.String("source", cmd.Source))
	if cfg := s.config(); cfg.OnCommit != nil {
		cfg.OnCommit(region)
	}
}

// reconcile applies a changed DERP map; it reports whether it aborted cur.
func (s *Switcher) reconcile(m *tailcfg.DERPMap, cur *op) (aborted bool) {
	s.stMu.Lock()
	slots := append([]*slot(nil), s.slots...)
	s.stMu.Unlock()
	home := s.homePtr.Load()
	for _, sl := range slots {
		if sl == home || (cur != nil && sl == cur.aux) {
			continue
		}
		if m.Regions[sl.region] == nil {
			s.removeSlot(sl)
		}
	}
	if cur != nil && m.Regions[cur.cmd.Target] == nil {
		s.abortOp(cur, "region removed from DERP map", 0)
		aborted = true
	}
	if home != nil && m.Regions[home.region] == nil {
		target := s.config().HomeRegion
		if ov := int(s.override.Load()); ov != 0 && m.Regions[ov] != nil {
			target = ov
		}
		s.logger().Warn("home region removed from DERP map; rehoming", zap.Int("region", home.region),
			zap.Int("target_region", target))
		s.rehome(target, Command{Source: "reconcile"})
	}
	if ov := int(s.override.Load()); ov != 0 && m.Regions[ov] == nil {
		s.logger().Warn("pinned region no longer in DERP map; clearing pin", zap.Int("region", ov))
		s.override.Store(0)
	}
	poke(s.pokeCh)
	return aborted
}
