// Package connhold holds the WebSocket connections of spaces that opt in, so that an open
// connection does not keep its space awake: the box terminates the WebSocket, parks an idle
// connection's socket in its own epoll set (no goroutine, no buffers), answers protocol pings
// and configured auto-responses itself, and turns each client message into an Event that a
// Deliverer carries to the space's instance (over its Unix socket, as an HTTP POST: see
// wire.go and docs/connections.md). A client message is kept until a checkpoint that started
// after the instance acknowledged it has completed, so an instance that crashes gets every
// later message again, marked as a redelivery, with the same sequence number.
//
// The package imports no Caddy: the glue (modules/lchat) hands it hijacked connections and
// implements Deliverer with the engine.
package connhold

import "github.com/gobwas/ws"

// Close codes the box sends (RFC 6455 section 7.4.1).
const (
	CloseNormal         = 1000
	CloseGoingAway      = 1001
	CloseProtocolError  = 1002
	CloseNoStatus       = 1005 // never sent: reported to the app when a close frame had no code
	CloseAbnormal       = 1006 // never sent: reported to the app when the socket ended without a close frame
	CloseInvalidData    = 1007 // a text message that is not UTF-8
	ClosePolicy         = 1008 // the client does not read what it is sent (outbound caps)
	CloseTooBig         = 1009 // a message over MaxMessage
	CloseInternal       = 1011 // the instance kept failing to take an event
	CloseServiceRestart = 1012 // the box drains
	CloseTryAgainLater  = 1013 // pending caps: the space cannot keep up, or the box is full
)

// peerCloseCode reports whether a peer may send code in a close frame (RFC 6455 section
// 7.4 and IANA's registry): 1000-1003, 1007-1014 and 3000-4999. 1004-1006 and 1015 are
// reserved, the rest below 3000 unassigned, 5000 and above not defined: a close frame
// with one of those is a protocol error (1002).
func peerCloseCode(code int) bool {
	return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) || (code >= 3000 && code <= 4999)
}

var _ = ws.OpText
