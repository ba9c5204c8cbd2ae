package single

import (
	"strings"
	"testing"
)

// TestRemoveSavesAwakeSpace: `lchat-caddy remove` of an awake space saves the writes it
// acknowledged since its last checkpoint (here the only checkpoint would be the sleep),
// so re-creating the route brings them back; on a kind of durability checkpoint,
// `remove --discard` is the explicit choice of dropping them.
func TestRemoveSavesAwakeSpace(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{Replication: "1h", Durability: "checkpoint"})
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

// TestRemoveDiscardKeepsDurableWrites: on a kind of durability bucket (the default) a write
// answered 201 is in the space's log already, so `remove --discard`, which skips the
// final checkpoint, drops nothing that was acknowledged: the re-created route has it.
func TestRemoveDiscardKeepsDurableWrites(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{Replication: "1h"})
	const host = "discarded.example.com"
	createSpace(t, b, host)
	postMessage(t, b, host, "acknowledged before discard")
	if out, err := b.CLI("remove", "--discard", host); err != nil {
		t.Fatalf("remove --discard: %v %s", err, out)
	}
	createSpace(t, b, host)
	if got := messages(t, b, host); !strings.Contains(got, "acknowledged before discard") {
		t.Fatalf("after remove --discard the space lost a write answered 201: %s", got)
	}
}
