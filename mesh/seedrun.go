package mesh

import "context"

// SeedEvent is one line of mesh-seed progress.
type SeedEvent struct {
	Event string `json:"event"` // plan, put, tombstone, error, done
	Host  string `json:"host,omitempty"`
	Error string `json:"error,omitempty"`
	N     int    `json:"n,omitempty"`
	Of    int    `json:"of,omitempty"`
	Puts  int    `json:"puts,omitempty"`
	Tombs int    `json:"tombstones,omitempty"`
	Fails int    `json:"failures,omitempty"`
}

// SeedPeer is where a mesh-seed run sends its plan: a peer's mesh API (*Client).
type SeedPeer interface {
	PutRoute(ctx context.Context, base string, row RouteRow) error
	DeleteRoute(ctx context.Context, base, host, rev string) error
}

// RunSeed carries out a Plan on peer: the puts, then the tombstones, one at a time, a
// failure counted and passed over. emit hears a "plan" event first (listed is the
// number of rows the peer listed), one "put", "tombstone" or "error" event per row and
// a "done" event last. It returns the number of failures.
func RunSeed(ctx context.Context, c SeedPeer, peer string, puts []RouteRow, tombs []Tombstone, listed int, emit func(SeedEvent)) int {
	emit(SeedEvent{Event: "plan", Puts: len(puts), Tombs: len(tombs), Of: listed})
	fails := 0
	for i, row := range puts {
		ev := SeedEvent{Event: "put", Host: row.Host, N: i + 1, Of: len(puts)}
		if err := c.PutRoute(ctx, peer, row); err != nil {
			fails++
			ev.Event, ev.Error = "error", err.Error()
		}
		emit(ev)
	}
	for i, tomb := range tombs {
		ev := SeedEvent{Event: "tombstone", Host: tomb.Host, N: i + 1, Of: len(tombs)}
		if err := c.DeleteRoute(ctx, peer, tomb.Host, tomb.Rev); err != nil {
			fails++
			ev.Event, ev.Error = "error", err.Error()
		}
		emit(ev)
	}
	emit(SeedEvent{Event: "done", Puts: len(puts), Tombs: len(tombs), Fails: fails})
	return fails
}
