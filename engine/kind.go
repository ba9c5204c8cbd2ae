package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/lchat/lchat-caddy/registry"
	"github.com/lchat/lchat-caddy/spacestore"
)

// Kind defaults.
const (
	DefaultIdleTimeout         = 10 * time.Minute
	DefaultStopGrace           = 10 * time.Second
	DefaultReadyTimeout        = 30 * time.Second
	DefaultReplicationInterval = 60 * time.Second
)

var signals = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT,
	"SIGHUP": syscall.SIGHUP, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2,
}

// ParseSignal reads a stop signal by name, with or without "SIG", in any case:
// SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1 or SIGUSR2. The empty name is 0 (the default,
// SIGTERM, once the kind's defaults apply).
func ParseSignal(name string) (syscall.Signal, error) {
	if name == "" {
		return 0, nil
	}
	s := strings.ToUpper(name)
	if !strings.HasPrefix(s, "SIG") {
		s = "SIG" + s
	}
	sig, ok := signals[s]
	if !ok {
		return 0, fmt.Errorf("stop_signal: unknown signal %q", name)
	}
	return sig, nil
}

// withDefaults is the one rule for kinds: it checks k, named name, and fills in its
// defaults. Errors name the config fields (as in the lchat app's JSON), so the same
// message reaches an operator whichever way the kind was configured.
func (k Kind) withDefaults(name string) (Kind, error) {
	if k.Name == "" {
		k.Name = name
	}
	if !registry.ValidKind(k.Name) {
		return k, fmt.Errorf("invalid kind name %q: use 1 to 64 of a-z, 0-9, '-' and '_', starting with a letter or digit", k.Name)
	}
	if k.Command == "" {
		return k, errors.New("command: required")
	}
	for n := range k.Env {
		if err := registry.ValidateEnvName(n); err != nil {
			return k, fmt.Errorf("env: %v", err)
		}
	}
	for _, n := range k.AllowedEnv {
		if err := registry.ValidateEnvName(n); err != nil {
			return k, fmt.Errorf("allowed_env: %v", err)
		}
		if registry.ForbiddenEnv(n) {
			return k, fmt.Errorf("allowed_env: %s may never come from a route (a loader, shell or reserved variable)", n)
		}
	}
	var err error
	if k.IdleTimeout, err = positive("idle_timeout", k.IdleTimeout, DefaultIdleTimeout); err != nil {
		return k, err
	}
	if k.StopGrace, err = positive("stop_grace", k.StopGrace, DefaultStopGrace); err != nil {
		return k, err
	}
	if k.Retention, err = positive("retention", k.Retention, spacestore.DefaultRetention); err != nil {
		return k, err
	}
	if k.GCGrace, err = positive("gc_grace", k.GCGrace, spacestore.DefaultGCGrace); err != nil {
		return k, err
	}
	if k.ReadyTimeout, err = positive("ready_timeout", k.ReadyTimeout, DefaultReadyTimeout); err != nil {
		return k, err
	}
	if k.StopSignal == 0 {
		k.StopSignal = syscall.SIGTERM
	}
	if k.ReadyPath != "" && !strings.HasPrefix(k.ReadyPath, "/") {
		return k, fmt.Errorf("ready_path: must start with /: %q", k.ReadyPath)
	}
	if k.WakePath == "" {
		k.WakePath = "/"
	}
	if !strings.HasPrefix(k.WakePath, "/") {
		return k, fmt.Errorf("wake_path: must start with /: %q", k.WakePath)
	}
	switch k.Replication.Class {
	case "", ReplicatePeriodic:
		k.Replication.Class = ReplicatePeriodic
		if k.Replication.Interval, err = positive("replication.interval", k.Replication.Interval, DefaultReplicationInterval); err != nil {
			return k, err
		}
	case ReplicateSleep, ReplicateContinuous:
		if k.Replication.Interval != 0 {
			return k, fmt.Errorf("replication.interval: only the periodic class takes an interval, not %q", k.Replication.Class)
		}
	default:
		return k, fmt.Errorf("replication.class: %q is not sleep, periodic or continuous", k.Replication.Class)
	}
	switch k.Durability {
	case "":
		k.Durability = DurabilityBucket
	case DurabilityCheckpoint, DurabilityBucket, DurabilityStandby:
	default:
		return k, fmt.Errorf("durability: %q is not bucket, standby or checkpoint", k.Durability)
	}
	return k, nil
}

// positive is d, or def when d is zero; a negative d is an error naming field.
func positive(field string, d, def time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return d, fmt.Errorf("%s: must be positive", field)
	case d == 0:
		return def, nil
	}
	return d, nil
}

// CheckSpaceKind reports whether a space of kind with env can run under kinds: the kind
// is configured, and every env name is one it allows. The error names no env value.
func CheckSpaceKind(kinds map[string]Kind, kind string, env map[string]string) error {
	k, ok := kinds[kind]
	if !ok {
		known := make([]string, 0, len(kinds))
		for name := range kinds {
			known = append(known, name)
		}
		slices.Sort(known)
		return fmt.Errorf("kind %q is not configured on this box (configured: %s)", kind, strings.Join(known, ", "))
	}
	for name := range env {
		if !slices.Contains(k.AllowedEnv, name) {
			return fmt.Errorf("env %s is not allowed by kind %q (allowed_env: %s)", name, kind, strings.Join(k.AllowedEnv, ", "))
		}
	}
	return nil
}
