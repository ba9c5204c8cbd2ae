package connhold

import (
	"net"
	"reflect"
)

// underHijacked is the connection under Caddy's hijacked connection of a request whose
// access is logged (caddyhttp.hijackedConn: it counts the bytes read and written and
// passes every one through, buffering none), so that the socket under it can be parked;
// any other connection is returned as it is. Without it a server with an access log (a
// site's `log`, which an operator behind a balancer turns on to see the clients) refused
// every held WebSocket.
func underHijacked(nc net.Conn) net.Conn {
	t := reflect.TypeOf(nc)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Name() != "hijackedConn" ||
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
