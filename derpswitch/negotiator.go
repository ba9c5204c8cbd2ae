package derpswitch

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// CmdKind is what a switch command asks of the executor.
type CmdKind int

const (
	// CmdNone: nothing to do; a new generation of it cancels an in-flight switch.
	CmdNone CmdKind = iota
	// CmdMBB: move the home make-before-break.
	CmdMBB
	// CmdRehome: tear down and connect the target directly (cold path, legacy mode).
	CmdRehome
)

func (k CmdKind) String() string {
	switch k {
	case CmdMBB:
		return "mbb"
	case CmdRehome:
		return "rehome"
	}
	return "none"
}

// Command is the switch command. Its only writer is the negotiator.
type Command struct {
	Kind       CmdKind
	Target     int
	Generation uint64
	Source     string // "pin" or "autoneg"
}

type outcomeKind int

const (
	outcomeCommitted outcomeKind = iota
	outcomeRolledBack
	outcomeAborted
)

type outcome struct {
	kind outcomeKind
	cmd  Command
}

type negotiator struct {
	s       *Switcher
	cmd     Command
	settled bool
	lastOv  int
	retryAt time.Time
	retryN  int
	damper  *Damper
	// damperCfg is the config damper was built with.
	damperCfg AutonegConfig
}

func (s *Switcher) issue(n *negotiator, kind CmdKind, target int, source string) Command {
	n.cmd = Command{Kind: kind, Target: target, Generation: n.cmd.Generation + 1, Source: source}
	n.settled = kind == CmdNone
	s.cmdMu.Lock()
	s.cmd = n.cmd
	s.cmdMu.Unlock()
	// The executor is poked after the pass (runNegotiator), so the pass's log line
	// ("PIN via MBB", ...) always precedes the executor's lines for the command.
	return n.cmd
}

func (s *Switcher) loadCmd() Command {
	s.cmdMu.Lock()
	defer s.cmdMu.Unlock()
	return s.cmd
}

func (s *Switcher) runNegotiator() {
	n := &negotiator{s: s, settled: true, damper: NewDamper(s.config().Autoneg), damperCfg: s.config().Autoneg}
	n.lastOv = int(s.override.Load())
	for {
		cfg := s.config()
		wait := cfg.TickInterval
		// The retry deadline matters only while no command is in flight: once the retry
		// is issued its deadline is past, and waiting on it would spin the loop for the
		// whole connect and prove.
		if n.settled && !n.retryAt.IsZero() {
			if d := n.retryAt.Sub(s.clock.Now()); d < wait {
				wait = d
			}
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.pokeCh:
		case o := <-s.outcomeCh:
			n.consume(o)
		case <-s.clock.After(wait):
		}
		// Drain outcomes that arrived together so evaluate sees the latest.
		for more := true; more; {
			select {
			case o := <-s.outcomeCh:
				n.consume(o)
			default:
				more = false
			}
		}
		gen := n.cmd.Generation
		n.evaluate()
		if n.cmd.Generation != gen {
			poke(s.cmdCh)
		}
	}
}

func (n *negotiator) consume(o outcome) {
	s := n.s
	if o.cmd.Generation != n.cmd.Generation {
		return // a stale result of a preempted command
	}
	n.settled = true
	now := s.clock.Now()
	ov := int(s.override.Load())
	switch o.kind {
	case outcomeCommitted:
		n.retryAt, n.retryN = time.Time{}, 0
		s.setRetry(time.Time{}, 0)
		if o.cmd.Kind == CmdMBB {
			n.damper.NoteHomeChange(now, o.cmd.Source == "autoneg")
		}
	case outcomeRolledBack:
		if ov != 0 && o.cmd.Target == ov {
			// A pin is a command, not advice: never ban, retry with backoff forever.
			backoff := s.config().RetryBackoff
			d := backoff[min(n.retryN, len(backoff)-1)]
			n.retryN++
			n.retryAt = now.Add(d)
			s.setRetry(n.retryAt, n.retryN)
			s.logger().Warn("pin MBB rolled back; old home keeps serving, retry scheduled",
				zap.Int("target_region", o.cmd.Target), zap.Uint64("generation", o.cmd.Generation),
				zap.Duration("retry_in", d), zap.Int("attempt", n.retryN))
		} else if o.cmd.Source == "autoneg" {
			n.damper.Ban(now, o.cmd.Target)
			s.logger().Info("autonegotiated switch rolled back; region banned",
				zap.Int("region", o.cmd.Target), zap.Duration("ban", s.config().Autoneg.BanDuration))
		}
	}
}

func (s *Switcher) setRetry(at time.Time, n int) {
	s.stMu.Lock()
	s.pinRetryAt, s.pinRetryN = at, n
	s.stMu.Unlock()
}

func (n *negotiator) evaluate() {
	s := n.s
	cfg := s.config()
	now := s.clock.Now()
	ov := int(s.override.Load())
	if ov != n.lastOv {
		// A new or changed pin starts a fresh retry schedule.
		n.lastOv, n.retryAt, n.retryN = ov, time.Time{}, 0
		s.setRetry(time.Time{}, 0)
	}
	homeRegion, alive := s.liveHome()

	if ov != 0 {
		if h := s.homePtr.Load(); h != nil && h.region == ov {
			// The home slot is on the pin: serving, or reconnecting in place. Nothing is
			// left to switch or retry, and a stale retry deadline would spin the loop.
			if !n.retryAt.IsZero() {
				n.retryAt, n.retryN = time.Time{}, 0
				s.setRetry(time.Time{}, 0)
			}
			if !n.settled && n.cmd.Target != ov {
				s.issue(n, CmdNone, 0, "pin")
			}
			return
		}
		if cfg.Mode == ModeLegacy {
			if !n.settled && n.cmd.Kind == CmdRehome && n.cmd.Target == ov {
				return
			}
			c := s.issue(n, CmdRehome, ov, "pin")
			s.logger().Info("pin applied by direct rehome", zap.Int("target_region", ov),
				zap.Bool("home_alive", alive), zap.String("mode", string(cfg.Mode)),
				zap.Uint64("generation", c.Generation))
			return
		}
		// Make-before-break whether the home is up or not. A lost home is reconnected
		// in place by its receive loop (the flush path); only a proven region ever
		// replaces it, so a blip while the pin is pending or proving never moves the
		// home onto an unproven region (cases 6 and 7).
		if !n.settled && n.cmd.Kind == CmdMBB && n.cmd.Target == ov {
			return // already in flight toward the pin: let it run
		}
		if !n.retryAt.IsZero() {
			if now.Before(n.retryAt) {
				return
			}
			c := s.issue(n, CmdMBB, ov, "pin")
			s.ctr.pinMBBRetries.Add(1)
			s.logger().Info("pin MBB retry", zap.Int("from_region", homeRegion),
				zap.Int("target_region", ov), zap.Uint64("generation", c.Generation),
				zap.Int("attempt", n.retryN), zap.Bool("home_alive", alive))
			return
		}
		c := s.issue(n, CmdMBB, ov, "pin")
		s.ctr.pinMBBRequests.Add(1)
		s.logger().Info("PIN via MBB (gapless; old home drains)", zap.Int("from_region", homeRegion),
			zap.Int("target_region", ov), zap.Uint64("generation", c.Generation), zap.Bool("home_alive", alive))
		return
	}

	if !n.settled && n.cmd.Source == "pin" {
		c := s.issue(n, CmdNone, 0, "pin")
		s.logger().Info("pin cleared; cancelling pin-sourced switch", zap.Uint64("generation", c.Generation))
		return
	}
	if !cfg.Autoneg.Enabled || !alive || !n.settled {
		return
	}
	if n.damperCfg != cfg.Autoneg {
		// A reload changed the damping: start its windows afresh.
		n.damper, n.damperCfg = NewDamper(cfg.Autoneg), cfg.Autoneg
	}
	s.stMu.Lock()
	lat := s.latencies
	s.stMu.Unlock()
	target := n.damper.Decide(now, homeRegion, lat)
	s.stMu.Lock()
	s.autonegNote = n.damper.Reason
	s.stMu.Unlock()
	if target == 0 {
		return
	}
	c := s.issue(n, CmdMBB, target, "autoneg")
	s.logger().Info("autonegotiated switch via MBB", zap.Int("from_region", homeRegion),
		zap.Int("target_region", target), zap.Duration("home_latency", lat[homeRegion]),
		zap.Duration("target_latency", lat[target]), zap.Uint64("generation", c.Generation))
}

func (s *Switcher) runLatency() {
	for {
		cfg := s.config()
		if cfg.Autoneg.Enabled {
			measure := cfg.Latency
			if measure == nil {
				measure = s.measureDERPLatency
			}
			// A slow region's probe needs its handshake: give the round at least 5 s.
			ctx, cancel := context.WithTimeout(s.ctx, max(cfg.Autoneg.Interval, 5*time.Second))
			lat := measure(ctx, s.derpMap.Load())
			cancel()
			s.stMu.Lock()
			s.latencies = lat
			s.stMu.Unlock()
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.clock.After(cfg.Autoneg.Interval):
		}
	}
}
