package connhold

import (
	"net"
	"reflect"
)

// passThrough names the connection wrappers of caddyhttp known to pass every byte
// through as their reader asks, buffering none, so that the socket under them can be
// parked (a wrapper that buffers or transforms bytes cannot be: Hub.Accept refuses it):
//   - hijackedConn: the hijacked connection of a request whose access is logged (it
//     counts the bytes read and written). Without it a server with an access log (a
//     site's `log`, which an operator behind a balancer turns on to see the clients)
//     refused every held WebSocket.
//   - http2Conn: the check of the HTTP/2 client preface, which wraps every plain-HTTP
//     connection of a server whose protocols leave HTTP/1.1 or HTTP/2 out (`protocols
//     h1`, as `lchat-caddy dev` serves).
var passThrough = map[string]bool{"hijackedConn": true, "http2Conn": true}

// underPassThrough is nc with every passThrough wrapper around it taken off; any other
// connection is returned as it is.
func underPassThrough(nc net.Conn) net.Conn {
	for {
		inner := unwrapPassThrough(nc)
		if inner == nc {
			return nc
		}
		nc = inner
	}
}

// unwrapPassThrough is the connection one passThrough wrapper holds, or nc.
func unwrapPassThrough(nc net.Conn) net.Conn {
	t := reflect.TypeOf(nc)
	if t == nil || t.Kind() != reflect.Pointer || !passThrough[t.Elem().Name()] ||
		t.Elem().PkgPath() != "github.com/caddyserver/caddy/v2/modules/caddyhttp" {
		return nc
	}
	f := reflect.ValueOf(nc).Elem().FieldByName("Conn")
	if !f.IsValid() || !f.CanInterface() {
		return nc
	}
	if inner, ok := f.Interface().(net.Conn); ok && inner != nil {
		return inner
	}
	return nc
}
