package single

import (
	"strings"
	"testing"
)

// TestRemoveSavesAwakeSpace: `lchat-caddy remove` of an awake space saves the writes it
// acknowledged since its last checkpoint (here the only checkpoint would be the sleep),
// so re-creating the route brings them back; `remove --discard` is the explicit choice
// of dropping them.
func TestRemoveSavesAwakeSpace(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{Replication: "1h"})
	const host = "removed.example.com"
	createSpace(t, b, host)
	postMessage(t, b, host, "acknowledged before remove")
	if out, err := b.CLI("remove", host); err != nil {
		t.Fatalf("remove: %v %s", err, out)
	}
	createSpace(t, b, host)
	if got := messages(t, b, host); !strings.Contains(got, "acknowledged before remove") {
		t.Fatalf("re-created space lost the write acknowledged before remove: %s", got)
	}

	postMessage(t, b, host, "dropped by discard")
	if out, err := b.CLI("remove", "--discard", host); err != nil {
		t.Fatalf("remove --discard: %v %s", err, out)
	}
	createSpace(t, b, host)
	got := messages(t, b, host)
	if strings.Contains(got, "dropped by discard") || !strings.Contains(got, "acknowledged before remove") {
		t.Fatalf("after remove --discard the space holds %s; want the saved write and not the discarded one", got)
	}
}
