package connhold

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestHijackedConnOfALoggedRequestParks: Caddy hands a handler of a request whose access
// it logs a response recorder, whose Hijack wraps the connection to count its bytes; the
// socket under it is still found, so a server with an access log holds WebSockets.
func TestHijackedConnOfALoggedRequestParks(t *testing.T) {
	got := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rr := caddyhttp.NewResponseRecorder(w, nil, nil)
		nc, _, err := rr.(http.Hijacker).Hijack()
		if err != nil {
			got <- err
			return
		}
		defer nc.Close()
		if _, ok := nc.(*net.TCPConn); ok {
			t.Error("the recorder's Hijack no longer wraps the connection: this test tests nothing")
		}
		_, err = connFD(nc)
		got <- err
	}))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	bufio.NewReader(c).Peek(1) // the handler closes the connection when done
	if err := <-got; err != nil {
		t.Fatalf("connFD of a logged request's hijacked connection: %v", err)
	}
}
