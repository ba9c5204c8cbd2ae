package box_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/box"
	"github.com/lchat/lchat-caddy/engine"
)

// TestRefuse: a space that cannot be served now is a 503 with the engine's hint and a
// reason, never a 502; a client gone while it waited is 499; only an unexpected failure
// is worth a log line.
func TestRefuse(t *testing.T) {
	const host = "r.example.com"
	for _, tc := range []struct {
		name       string
		err        error
		gone       bool
		status     int
		after      time.Duration
		says       string
		unexpected bool
	}{
		{"lease held", &engine.LeaseHeldError{Holder: "box:x"}, false, 503, 0, "held by another box", false},
		{"backoff", &engine.RetryError{After: 7 * time.Second, Reason: "failed wake"}, false, 503, 7 * time.Second, "failed wake", false},
		{"draining", fmt.Errorf("acquiring: %w", engine.ErrDraining), false, 503, engine.ErrDraining.After, "shutting down", false},
		{"kind gone", engine.ErrUnknownKind, false, 503, 0, "kind is not configured", false},
		{"client gone", context.Canceled, true, 499, 0, "canceled", false},
		{"canceled, client here", context.Canceled, false, 503, 0, "waking space", true},
		{"bucket down", errors.New("bucket unreachable"), false, 503, 0, "waking space " + host + " failed", true},
	} {
		ref := box.Refuse(host, tc.err, tc.gone)
		if ref.Status != tc.status || ref.RetryAfter != tc.after || !strings.Contains(ref.Err.Error(), tc.says) || ref.Unexpected != tc.unexpected {
			t.Errorf("%s: %+v, want status %d, retry after %v, saying %q, unexpected %v", tc.name, ref, tc.status, tc.after, tc.says, tc.unexpected)
		}
		if ref.Status != http.StatusServiceUnavailable && ref.Status != 499 {
			t.Errorf("%s: status %d", tc.name, ref.Status)
		}
	}
}

// TestEngineCounters: every engine counter is flattened, by its JSON name.
func TestEngineCounters(t *testing.T) {
	got := box.EngineCounters(engine.Counters{Wakes: 1, LeaseConflicts: 2, OOMKills: 3, SkippedFiles: 4, CapRefusals: 5})
	for name, want := range map[string]uint64{"wakes": 1, "lease_conflicts": 2, "oom_kills": 3, "skipped_files": 4, "cap_refusals": 5, "sleeps": 0} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %d (present %v), want %d", name, v, ok, want)
		}
	}
	if len(got) != 12 {
		t.Errorf("%d counters, want the engine's 12: %v", len(got), got)
	}
}
