package box

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/lchat/lchat-caddy/mesh"
)

// Peer is where one forwarded request goes; the handler puts it on the request's context
// (WithPeer) before its reverse proxy sends the request through a PeerTransport.
type Peer struct {
	// Self is the peer's SELF URL.
	Self string
	// Hint: the forward follows a holder entry (mesh.HintHeader).
	Hint bool
	// Hops is how many times the request was forwarded before it reached this box.
	Hops int
}

type peerKey struct{}

// WithPeer returns ctx carrying p for the PeerTransport.
func WithPeer(ctx context.Context, p Peer) context.Context {
	return context.WithValue(ctx, peerKey{}, p)
}

// peerResponseHeaderTimeout bounds the wait for a forwarded request's response headers:
// longer than a wake's default readiness timeout plus a restore, far shorter than forever.
const peerResponseHeaderTimeout = 2 * time.Minute

// PeerTransport carries forwarded requests to peers. It dials the peer's address (its
// SELF) and, for an https SELF, verifies the peer's certificate against the instance
// hostname, the request's Host: the SNI and the verified name are the space's name, as
// they would be for a client that reached the peer directly. Idle connections are pooled
// per (peer, instance host), so a connection verified for one host is never reused for
// another. There is no way to skip verification.
type PeerTransport struct {
	tr      *http.Transport
	marker  mesh.Marker
	holders *mesh.Holders
}

// DialError is a failure to reach an upstream (a peer, an instance's socket) before
// anything was sent: the request may be sent again or served elsewhere (RetrySafe).
type DialError struct{ Err error }

func (e DialError) Error() string { return e.Err.Error() }
func (e DialError) Unwrap() error { return e.Err }

// IsDialError reports whether err is a failure to reach an upstream before anything was
// sent: a DialError (the PeerTransport's), or a failed dial of a socket (*net.OpError
// "dial", an instance's).
func IsDialError(err error) bool {
	var de DialError
	var oe *net.OpError
	return errors.As(err, &de) || errors.As(err, &oe) && oe.Op == "dial"
}

// PeerTransport returns the mesh's forward transport. Its errors from before anything
// was sent are DialErrors, passed through wrap when it is set (the glue makes them the
// reverse proxy's own DialError, so the proxy knows them too).
func (ms *Mesh) PeerTransport(wrap func(error) error) *PeerTransport {
	dialError := func(err error) error {
		err = DialError{err}
		if wrap != nil {
			err = wrap(err)
		}
		return err
	}
	pt := &PeerTransport{marker: ms.marker}
	if ms.node != nil {
		pt.holders = ms.node.Holders
	}
	dialer := &net.Dialer{Timeout: ms.timeout, KeepAlive: 30 * time.Second}
	// dial connects to the peer of a pool key; a failure is a dial error.
	dial := func(ctx context.Context, addr string) (conn net.Conn, peer, serverName string, err error) {
		if peer, serverName, err = decodePoolKey(addr); err != nil {
			return nil, "", "", err
		}
		if conn, err = dialer.DialContext(ctx, "tcp", peer); err != nil {
			return nil, "", "", dialError(err)
		}
		return conn, peer, serverName, nil
	}
	pt.tr = &http.Transport{
		// Never through an environment proxy: the peer's address is the point.
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, _, _, err := dial(ctx, addr)
			return conn, err
		},
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, peer, serverName, err := dial(ctx, addr)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(conn, &tls.Config{
				ServerName: serverName,
				RootCAs:    ms.roots,
				MinVersion: tls.VersionTLS12,
				NextProtos: []string{"http/1.1"},
			})
			hctx, cancel := context.WithTimeout(ctx, ms.timeout)
			defer cancel()
			if err := tc.HandshakeContext(hctx); err != nil {
				conn.Close()
				err = fmt.Errorf("TLS handshake with peer %s as %s: %w", peer, serverName, err)
				var bad *tls.CertificateVerificationError
				if errors.As(err, &bad) {
					return nil, err
				}
				// The connection closed or timed out before a request was sent (the
				// peer is gone, behind a proxy or balancer that accepted for it): as
				// good as a failed dial.
				return nil, dialError(err)
			}
			return tc, nil
		},
		// Pools are per (peer, instance host): bound the total too, or a box that
		// forwards for many hosts keeps a TLS connection open for each of them.
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		// A wake on the peer may take a while (restore, readiness), but a peer that
		// never answers must not hold the request, and its client, forever.
		ResponseHeaderTimeout: peerResponseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
	}
	return pt
}

// poolKey names an idle-connection pool: the peer address and, for TLS, the verified
// name. Hex keeps it a valid URL host whatever the inputs.
func poolKey(peer, serverName string) string {
	return hex.EncodeToString([]byte(peer + "|" + serverName))
}

func decodePoolKey(addr string) (peer, serverName string, err error) {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	raw, err := hex.DecodeString(host)
	if err != nil {
		return "", "", fmt.Errorf("forward: bad peer key")
	}
	peer, serverName, _ = strings.Cut(string(raw), "|")
	return peer, serverName, nil
}

// RoundTrip marks the request as forwarded one hop further (MAC over the instance host
// and the hop) and sends it to the peer on its context (WithPeer). The peer's answer names
// the box that served it from its awake instance (mesh.HolderHeader): that is remembered
// as where the space is awake, and the header goes no further than the box the client
// reached.
func (pt *PeerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	p, _ := req.Context().Value(peerKey{}).(Peer)
	u, err := url.Parse(p.Self)
	if err != nil || p.Self == "" {
		return nil, errors.New("forward: no peer chosen")
	}
	host := mesh.NormalizeHost(req.Host)
	pt.marker.MarkHop(req.Header, host, p.Hops+1)
	if p.Hint {
		req.Header.Set(mesh.HintHeader, "1")
	} else {
		req.Header.Del(mesh.HintHeader)
	}
	addr := mesh.DialAddr(u)
	req.URL.Scheme = u.Scheme
	if u.Scheme == "https" {
		req.URL.Host = poolKey(addr, host)
	} else {
		req.URL.Host = poolKey(addr, "")
	}
	resp, err := pt.tr.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if holder, ok := mesh.TakeHolder(resp.Header, p.Hops); ok && pt.holders != nil {
		pt.holders.Put(host, holder)
	}
	return resp, nil
}

// Interface guards
var _ http.RoundTripper = (*PeerTransport)(nil)
