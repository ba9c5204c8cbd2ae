package mesh

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ForwardedHeader marks a request one box has forwarded to another. A request carrying a
// valid marker is never forwarded again.
const ForwardedHeader = "X-Lchat-Mesh-Forwarded"

// DefaultMarkerWindow is how far a marker's timestamp may be from the verifier's clock,
// either way, before the marker is refused.
const DefaultMarkerWindow = 60 * time.Second

// Marker signs and checks the forwarded marker with the mesh token. Its value is
// "<unix-seconds>.<hex HMAC-SHA256(token, host + "|" + unix-seconds)>", so it binds the
// instance host and a time: outside traffic can neither forge it nor move it to another
// host, and a captured one expires after Window. Within the window a captured marker could
// be replayed for the same host; that only makes a box serve the request itself instead
// of forwarding, which the per-space lease already resolves.
type Marker struct {
	// Token is the mesh token, which signs. An empty token makes every marker invalid.
	Token Secret
	// Accept are further tokens whose markers verify (a token rotation in progress).
	Accept []Secret
	// Window bounds the clock difference accepted. Default: DefaultMarkerWindow.
	Window time.Duration
	// Now is the clock. Default: time.Now.
	Now func() time.Time
}

func (m Marker) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

func (m Marker) window() time.Duration {
	if m.Window > 0 {
		return m.Window
	}
	return DefaultMarkerWindow
}

// MaxHops is the most forwards a request makes between boxes: one to the host's
// owner, one more to the box its space is awake on, one from a draining box to the box
// that takes its space over (placement's forwards end there: PlaceHops), and a last one
// to the box the space's lease names, when the space moved while the request was on its
// way (Node.LeaseHeld).
const MaxHops = 4

// PlaceHops is the most forwards a request makes by placement (to an owner, a holder
// entry, a draining box's successor, a box with room under the awake cap); only a forward
// that follows the lease itself may go past it, up to MaxHops.
const PlaceHops = MaxHops - 1

// Sign returns the marker value for host at time t, for a request's first forward.
func (m Marker) Sign(host string, t time.Time) string {
	return m.SignHop(host, t, 1)
}

// SignHop returns the marker value for host at time t for the hop-th forward of a
// request (1 to MaxHops). A first forward's value is "<unix-seconds>.<mac>"; a later
// one's is "<hop>:<unix-seconds>.<mac>" with the hop under the MAC, so a box cannot be
// made to forward a request more often than MaxHops.
func (m Marker) SignHop(host string, t time.Time, hop int) string {
	hop = min(max(hop, 1), MaxHops)
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hex.EncodeToString(m.mac(NormalizeHost(host), ts, hop))
	if hop == 1 {
		return ts + "." + mac
	}
	return strconv.Itoa(hop) + ":" + ts + "." + mac
}

func (m Marker) mac(host, ts string, hop int) []byte {
	return macWith(m.Token, host, ts, hop)
}

func macWith(token Secret, host, ts string, hop int) []byte {
	h := hmac.New(sha256.New, []byte(token))
	h.Write([]byte(host))
	h.Write([]byte{'|'})
	h.Write([]byte(ts))
	if hop > 1 {
		h.Write([]byte{'|'})
		h.Write([]byte(strconv.Itoa(hop)))
	}
	return h.Sum(nil)
}

// Errors from Verify. They carry no part of the token or the MAC.
var (
	ErrMarkerMalformed = errors.New("forwarded marker malformed")
	ErrMarkerStale     = errors.New("forwarded marker outside the time window")
	ErrMarkerBadMAC    = errors.New("forwarded marker MAC mismatch")
)

// Verify checks one marker value for host: well formed, within the window, and with a
// MAC that matches in constant time.
func (m Marker) Verify(value, host string) error {
	_, err := m.verify(value, host)
	return err
}

// verify checks value and returns which forward of the request it marks (1 to MaxHops).
func (m Marker) verify(value, host string) (int, error) {
	if m.Token == "" {
		return 0, ErrMarkerBadMAC
	}
	value = strings.TrimSpace(value)
	hop := 1
	if h, rest, ok := strings.Cut(value, ":"); ok {
		n, err := strconv.Atoi(h)
		if err != nil || n < 2 || n > MaxHops || strconv.Itoa(n) != h {
			return 0, ErrMarkerMalformed
		}
		hop, value = n, rest
	}
	ts, sig, ok := strings.Cut(value, ".")
	if !ok || len(ts) == 0 || len(ts) > 19 || len(sig) != 2*sha256.Size {
		return 0, ErrMarkerMalformed
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sec < 0 || strconv.FormatInt(sec, 10) != ts {
		return 0, ErrMarkerMalformed
	}
	got, err := hex.DecodeString(sig)
	if err != nil || hex.EncodeToString(got) != sig {
		// Only the lowercase hex Sign makes: one spelling per marker.
		return 0, ErrMarkerMalformed
	}
	if d := m.now().Sub(time.Unix(sec, 0)); d > m.window() || d < -m.window() {
		return 0, ErrMarkerStale
	}
	host = NormalizeHost(host)
	ok = hmac.Equal(got, m.mac(host, ts, hop))
	for _, t := range m.Accept {
		if t != "" && hmac.Equal(got, macWith(t, host, ts, hop)) {
			ok = true
		}
	}
	if !ok {
		return 0, ErrMarkerBadMAC
	}
	return hop, nil
}

// Mark sets the forwarded marker for host on h, replacing any other value: a first
// forward.
func (m Marker) Mark(h http.Header, host string) {
	m.MarkHop(h, host, 1)
}

// MarkHop sets the marker of the hop-th forward for host on h.
func (m Marker) MarkHop(h http.Header, host string, hop int) {
	h.Set(ForwardedHeader, m.SignHop(host, m.now(), hop))
}

// Valid reports whether h carries exactly one forwarded marker and it is valid for host.
func (m Marker) Valid(h http.Header, host string) bool {
	return m.Hops(h, host) > 0
}

// Hops is how many times the request with header h was forwarded, by its valid marker
// for host: 0 when it has none (or more than one, or an invalid one).
func (m Marker) Hops(h http.Header, host string) int {
	vals := h.Values(ForwardedHeader)
	if len(vals) != 1 {
		return 0
	}
	hop, err := m.verify(vals[0], host)
	if err != nil {
		return 0
	}
	return hop
}

// Strip removes every forwarded marker from h unless it carries a valid one, and reports
// whether the request was validly forwarded. The lchat handler calls it first on every
// request so outside traffic can neither spoof nor suppress forwarding.
func (m Marker) Strip(h http.Header, host string) (forwarded bool) {
	return m.StripHops(h, host) > 0
}

// StripHops is Strip, returning how many times the request was forwarded (0: not
// validly forwarded; the marker is removed).
func (m Marker) StripHops(h http.Header, host string) int {
	hop := m.Hops(h, host)
	if hop == 0 {
		h.Del(ForwardedHeader)
	}
	return hop
}
