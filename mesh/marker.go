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
	// Token is the mesh token. An empty token makes every marker invalid.
	Token Secret
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

// Sign returns the marker value for host at time t.
func (m Marker) Sign(host string, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return ts + "." + hex.EncodeToString(m.mac(NormalizeHost(host), ts))
}

func (m Marker) mac(host, ts string) []byte {
	h := hmac.New(sha256.New, []byte(m.Token))
	h.Write([]byte(host))
	h.Write([]byte{'|'})
	h.Write([]byte(ts))
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
	if m.Token == "" {
		return ErrMarkerBadMAC
	}
	ts, sig, ok := strings.Cut(strings.TrimSpace(value), ".")
	if !ok || len(ts) == 0 || len(ts) > 19 || len(sig) != 2*sha256.Size {
		return ErrMarkerMalformed
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sec < 0 || strconv.FormatInt(sec, 10) != ts {
		return ErrMarkerMalformed
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return ErrMarkerMalformed
	}
	if d := m.now().Sub(time.Unix(sec, 0)); d > m.window() || d < -m.window() {
		return ErrMarkerStale
	}
	if !hmac.Equal(got, m.mac(NormalizeHost(host), ts)) {
		return ErrMarkerBadMAC
	}
	return nil
}

// Mark sets the forwarded marker for host on h, replacing any other value.
func (m Marker) Mark(h http.Header, host string) {
	h.Set(ForwardedHeader, m.Sign(host, m.now()))
}

// Valid reports whether h carries exactly one forwarded marker and it is valid for host.
func (m Marker) Valid(h http.Header, host string) bool {
	vals := h.Values(ForwardedHeader)
	return len(vals) == 1 && m.Verify(vals[0], host) == nil
}

// Strip removes every forwarded marker from h unless it carries a valid one, and reports
// whether the request was validly forwarded. The lchat handler calls it first on every
// request so outside traffic can neither spoof nor suppress forwarding.
func (m Marker) Strip(h http.Header, host string) (forwarded bool) {
	if m.Valid(h, host) {
		return true
	}
	h.Del(ForwardedHeader)
	return false
}
