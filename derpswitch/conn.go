package derpswitch

import (
	"context"

	"tailscale.com/derp"
	"tailscale.com/derp/derphttp"
	"tailscale.com/net/netmon"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
	"tailscale.com/types/logger"
)

// Conn is one DERP connection to one region. *derphttp.Client implements it; unit
// tests substitute a fake.
type Conn interface {
	// Connect connects unless already connected.
	Connect(ctx context.Context) error
	// Ping sends a ping to the server and waits for its pong. A Recv loop must run.
	Ping(ctx context.Context) error
	Send(dst key.NodePublic, b []byte) error
	SendPong(data [8]byte) error
	NotePreferred(bool)
	// RecvDetail returns the next message and the connection generation, which
	// increments on every (implicit) reconnect.
	RecvDetail() (derp.ReceivedMessage, int, error)
	Close() error
}

// DialFunc returns a new, not yet connected Conn to a region. getRegion returns the
// region's current definition (it follows DERP map updates).
type DialFunc func(getRegion func() *tailcfg.DERPRegion) Conn

// DERPHTTPDialer returns a DialFunc making derphttp region clients with the node key
// priv. TLS is used as the DERP map says (a node's InsecureForTests skips
// verification, for loopback test servers only).
func DERPHTTPDialer(priv key.NodePrivate, logf logger.Logf) DialFunc {
	netMon := netmon.NewStatic()
	return func(getRegion func() *tailcfg.DERPRegion) Conn {
		c := derphttp.NewRegionClient(priv, logf, netMon, getRegion)
		c.SetCanAckPings(true)
		return c
	}
}

// Interface guards
var _ Conn = (*derphttp.Client)(nil)
