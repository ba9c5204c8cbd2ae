// Package proxyproto accepts the PROXY protocol (v1 and v2, as HAProxy's send-proxy and
// send-proxy-v2 and an AWS Network Load Balancer send it) from the balancer addresses it
// is given, and from no one else, without reading a byte past the header: a connection
// keeps its own socket, so a held WebSocket on it can still be parked by its file
// descriptor (connhold), which a buffering reader (Caddy's proxy_protocol wrapper, over
// github.com/pires/go-proxyproto) would make impossible. The header's fields are parsed
// by go-proxyproto; this package only frames them.
package proxyproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// v2Sig opens a version 2 header; v1Sig a version 1 header.
var (
	v2Sig = []byte("\r\n\r\n\x00\r\nQUIT\n")
	v1Sig = []byte("PROXY ")
)

const (
	// v1Max is the longest version 1 header, its CRLF included.
	v1Max = 107
	// v2Fixed is a version 2 header's fixed part: signature, version and command,
	// family and protocol, length.
	v2Fixed = 16
	// V2MaxLen bounds a version 2 header's address and TLV part. The protocol allows
	// 65535 bytes; balancers send a few dozen (an NLB's TLVs included).
	V2MaxLen = 4096
)

// ErrShort is HeaderLen's answer when b is too short to tell: it starts like a header
// (or is empty) and the rest has not arrived.
var ErrShort = errors.New("proxyproto: header incomplete")

// HeaderLen frames the PROXY protocol header at the start of b, the first bytes a
// connection sent: the header's length in bytes (b may be shorter for version 2, whose
// length is in its first 16 bytes); 0 when b does not start with one (every byte is the
// application's); ErrShort when it cannot tell yet; any other error for a header that is
// malformed (a version 1 line without its CRLF within 107 bytes, a version 2 length past
// V2MaxLen).
func HeaderLen(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, ErrShort
	}
	switch {
	case bytes.HasPrefix(v2Sig, b[:min(len(b), len(v2Sig))]):
		if len(b) < v2Fixed {
			return 0, ErrShort
		}
		n := int(binary.BigEndian.Uint16(b[14:16]))
		if n > V2MaxLen {
			return 0, fmt.Errorf("proxyproto: version 2 header of %d bytes, more than %d", n, V2MaxLen)
		}
		return v2Fixed + n, nil
	case bytes.HasPrefix(v1Sig, b[:min(len(b), len(v1Sig))]):
		if len(b) < len(v1Sig) {
			return 0, ErrShort
		}
		line := b[:min(len(b), v1Max)]
		i := bytes.IndexByte(line, '\n')
		switch {
		case i < 0 && len(b) >= v1Max:
			return 0, fmt.Errorf("proxyproto: version 1 header without its CRLF within %d bytes", v1Max)
		case i < 0:
			return 0, ErrShort
		case i == 0 || line[i-1] != '\r':
			return 0, errors.New("proxyproto: version 1 header must end with CRLF")
		}
		return i + 1, nil
	}
	return 0, nil
}
