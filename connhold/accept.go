package connhold

import (
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// IsUpgrade reports whether r asks for a WebSocket over HTTP/1.1 (the only kind the box
// holds; an HTTP/2 WebSocket is proxied as today).
func IsUpgrade(r *http.Request) bool {
	return r.ProtoMajor == 1 && r.Method == http.MethodGet &&
		httpguts.HeaderValuesContainsToken(r.Header["Connection"], "upgrade") && httpguts.HeaderValuesContainsToken(r.Header["Upgrade"], "websocket")
}

// Opted reports whether an instance's answer to an upgrade request opts the connection in.
func Opted(status int, h http.Header) bool {
	return status/100 == 2 && strings.EqualFold(strings.TrimSpace(h.Get(HoldHeader)), HoldValue)
}

const acceptGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// CheckHandshake reports why r is not a WebSocket handshake the box can complete: a
// Sec-WebSocket-Key that is not 16 bytes in base64, or a Sec-WebSocket-Version other than
// 13, for which it sets Sec-WebSocket-Version: 13 on h (RFC 6455 section 4.4: the refusal
// names the version the box speaks). The caller answers 400. The glue asks before it
// proxies an upgrade, so a handshake the box would refuse never wakes a space.
func CheckHandshake(r *http.Request, h http.Header) error {
	if raw, err := base64.StdEncoding.DecodeString(r.Header.Get("Sec-WebSocket-Key")); err != nil || len(raw) != 16 {
		return errors.New("bad Sec-WebSocket-Key")
	}
	if r.Header.Get("Sec-WebSocket-Version") != "13" {
		h.Set("Sec-WebSocket-Version", "13")
		return errors.New("unsupported Sec-WebSocket-Version")
	}
	return nil
}

// Accept completes the WebSocket handshake of r itself (101, Sec-WebSocket-Accept, the
// subprotocol the instance chose, which must be one the client offered), hijacks the
// connection and holds it (Adopt). open is the instance's answer to the upgrade request;
// protocol its Sec-WebSocket-Protocol. When the request is not a valid handshake nothing is
// written and the caller answers the error (with a 4xx: for a version other than 13 the
// header RFC 6455 section 4.4 asks for, Sec-WebSocket-Version: 13, is set on w); a connection that cannot be parked (a listener
// wrapper without a file descriptor) is answered 503 here, after the hijack.
func (h *Hub) Accept(w http.ResponseWriter, r *http.Request, space, id string, open Reply, protocol string) (*Conn, error) {
	if err := CheckHandshake(r, w.Header()); err != nil {
		return nil, err
	}
	key := r.Header.Get("Sec-WebSocket-Key")
	if protocol != "" && !httpguts.HeaderValuesContainsToken(r.Header["Sec-WebSocket-Protocol"], protocol) {
		return nil, fmt.Errorf("the instance chose subprotocol %q, which the client did not offer", protocol)
	}
	sum := sha1.Sum([]byte(key + acceptGUID))
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, fmt.Errorf("hijacking: %w", err)
	}
	if _, err := connFD(nc); err != nil {
		// A listener wrapper that buffers or transforms bytes (http_redirect, PROXY
		// protocol) cannot be parked: refuse before the handshake, so the client is not
		// told yes.
		nc.Write([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
		nc.Close()
		return nil, err
	}
	var resp strings.Builder
	resp.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ")
	resp.WriteString(base64.StdEncoding.EncodeToString(sum[:]))
	if protocol != "" {
		resp.WriteString("\r\nSec-WebSocket-Protocol: " + protocol)
	}
	resp.WriteString("\r\n\r\n")
	if _, err := nc.Write([]byte(resp.String())); err != nil {
		nc.Close()
		return nil, fmt.Errorf("writing the handshake: %w", err)
	}
	var buffered []byte
	if n := brw.Reader.Buffered(); n > 0 {
		buffered, _ = brw.Reader.Peek(n)
	}
	c, err := h.Adopt(nc, buffered, space, id, open)
	if err != nil {
		nc.Write(closeFrame(CloseServiceRestart, ""))
		nc.Close()
		return nil, err
	}
	return c, nil
}
