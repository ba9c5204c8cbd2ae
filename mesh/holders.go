package mesh

import (
	"sync"
	"time"
)

// HolderHeader names, on the response to a forwarded request, the box that served it
// from its own awake instance: the space's lease holder. The forwarding box learns the
// holder from it (Holders) and removes it before the response leaves the mesh.
const HolderHeader = "X-Lchat-Mesh-Holder"

// HintHeader, on a forwarded request, says it was sent to the box its space was last
// seen awake on (a Holders entry). The entry goes stale when the space sleeps there, so
// the box that finds the space asleep sends it on to the owner (Place) instead of waking
// it wherever the hint pointed. It counts only beside a valid marker; a forged one can
// cost one more bounded hop, nothing else.
const HintHeader = "X-Lchat-Mesh-Hint"

// DefaultHolderTTL is how long a learned holder is used without being confirmed by a
// response naming it.
const DefaultHolderTTL = 30 * time.Second

// Holders remembers, per host, the box its space was last seen awake on, so a request
// goes there directly instead of by way of the host's owner, and the owner does not ask
// the bucket for the lease on every request. An entry is used only while it is fresh
// (confirmed within TTL by a response from that box) and the box is a live member; a
// holder that leaves the mesh is passed over at once.
type Holders struct {
	// TTL is how long an entry lasts unconfirmed. Default DefaultHolderTTL.
	TTL time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time

	mu sync.Mutex
	m  map[string]holderEntry
}

type holderEntry struct {
	self  string
	until time.Time
}

func (h *Holders) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

func (h *Holders) ttl() time.Duration {
	if h.TTL > 0 {
		return h.TTL
	}
	return DefaultHolderTTL
}

// Put records (or confirms) self as where host's space is awake.
func (h *Holders) Put(host, self string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = make(map[string]holderEntry)
	}
	h.m[host] = holderEntry{self: self, until: h.now().Add(h.ttl())}
}

// Forget drops what is known of host's holder.
func (h *Holders) Forget(host string) {
	h.mu.Lock()
	delete(h.m, host)
	h.mu.Unlock()
}

// Get returns host's holder while its entry is fresh.
func (h *Holders) Get(host string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.m[host]
	if !ok {
		return "", false
	}
	if !h.now().Before(e.until) {
		delete(h.m, host)
		return "", false
	}
	return e.self, true
}

// Len is the number of entries, fresh or not yet swept.
func (h *Holders) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.m)
}
