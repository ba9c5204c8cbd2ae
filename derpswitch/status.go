package derpswitch

import (
	"sort"
	"sync/atomic"
	"time"
)

// Switch states, as reported in Status.
const (
	StateIdle       = "idle"
	StateAuxOpening = "aux_opening"
	StateProving    = "proving"
	StateRehoming   = "rehoming"
)

// Counters are the switch counters (monotonic since the Switcher started).
type Counters struct {
	PinMBBRequests uint64 `json:"pin_mbb_requests"`
	PinMBBCommits  uint64 `json:"pin_mbb_commits"`
	PinMBBRetries  uint64 `json:"pin_mbb_retries"`
	DERPReconnects uint64 `json:"derp_reconnects"`
	RehomeApplied  uint64 `json:"rehome_applied"`
	Rollbacks      uint64 `json:"rollbacks"`
	MBBCommits     uint64 `json:"mbb_commits"`
	EchoReplies    uint64 `json:"echo_replies"`
}

type counters struct {
	pinMBBRequests, pinMBBCommits, pinMBBRetries atomic.Uint64
	derpReconnects, rehomeApplied, rollbacks     atomic.Uint64
	mbbCommits, echoReplies                      atomic.Uint64
}

func (c *counters) snapshot() Counters {
	return Counters{
		PinMBBRequests: c.pinMBBRequests.Load(),
		PinMBBCommits:  c.pinMBBCommits.Load(),
		PinMBBRetries:  c.pinMBBRetries.Load(),
		DERPReconnects: c.derpReconnects.Load(),
		RehomeApplied:  c.rehomeApplied.Load(),
		Rollbacks:      c.rollbacks.Load(),
		MBBCommits:     c.mbbCommits.Load(),
		EchoReplies:    c.echoReplies.Load(),
	}
}

// SlotStatus describes one connection slot.
type SlotStatus struct {
	Region    int    `json:"region"`
	Role      string `json:"role"`
	Connected bool   `json:"connected"`
}

// SwitchStatus is the switch command and the executor's state.
type SwitchStatus struct {
	State      string `json:"state"`
	Kind       string `json:"kind,omitempty"`
	Target     int    `json:"target"`
	Generation uint64 `json:"generation"`
	Source     string `json:"source,omitempty"`
}

// Status is the switcher's state as reported by the admin endpoint.
type Status struct {
	Mode          Mode         `json:"mode"`
	HomeRegion    int          `json:"home_region"`
	HomeConnected bool         `json:"home_connected"`
	EffectiveHome int          `json:"effective_home"`
	Override      int          `json:"override"`
	PinPending    bool         `json:"pin_pending"`
	PinRetries    int          `json:"pin_retry_attempt,omitempty"`
	PinRetryIn    string       `json:"pin_retry_in,omitempty"`
	Switch        SwitchStatus `json:"switch"`
	Slots         []SlotStatus `json:"slots"`
	Autoneg       string       `json:"autoneg,omitempty"`
	// Latencies is autonegotiation's last measurement per region.
	Latencies map[int]string `json:"latencies,omitempty"`
	Counters
}

// Status returns a snapshot.
func (s *Switcher) Status() Status {
	cfg := s.config()
	st := Status{Mode: cfg.Mode, Override: int(s.override.Load()), Counters: s.ctr.snapshot()}
	st.HomeRegion, st.HomeConnected = s.liveHome()
	st.EffectiveHome = st.HomeRegion
	if st.Override != 0 {
		st.EffectiveHome = st.Override
	}
	st.PinPending = st.Override != 0 && !(st.HomeConnected && st.HomeRegion == st.Override)
	cmd := s.loadCmd()
	st.Switch = SwitchStatus{Kind: cmd.Kind.String(), Target: cmd.Target, Generation: cmd.Generation, Source: cmd.Source}
	s.stMu.Lock()
	st.Switch.State = s.state
	if !s.pinRetryAt.IsZero() {
		st.PinRetries = s.pinRetryN
		st.PinRetryIn = max(0, s.pinRetryAt.Sub(s.clock.Now())).Round(time.Millisecond).String()
	}
	if cfg.Autoneg.Enabled {
		st.Autoneg = s.autonegNote
		if st.Autoneg == "" {
			st.Autoneg = "enabled"
		}
		for r, d := range s.latencies {
			if st.Latencies == nil {
				st.Latencies = map[int]string{}
			}
			st.Latencies[r] = d.Round(10 * time.Microsecond).String()
		}
	}
	for _, sl := range s.slots {
		st.Slots = append(st.Slots, SlotStatus{Region: sl.region, Role: sl.getRole(), Connected: sl.connected.Load()})
	}
	s.stMu.Unlock()
	sort.SliceStable(st.Slots, func(i, j int) bool { return st.Slots[i].Role == RoleHome && st.Slots[j].Role != RoleHome })
	return st
}

// Counters returns the counters.
func (s *Switcher) Counters() Counters { return s.ctr.snapshot() }
