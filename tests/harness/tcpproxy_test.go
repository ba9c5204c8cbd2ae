package harness

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
)

// TestTCPProxySetClosed: a closed proxy refuses dials (as a machine where nothing listens),
// and forwards again on the same address once reopened.
func TestTCPProxySetClosed(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "hi")
			c.Close()
		}
	}()
	p := StartTCPProxy(t, target.Addr().String())
	read := func() (string, error) {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			return "", err
		}
		defer c.Close()
		b, err := io.ReadAll(c)
		return string(b), err
	}
	if got, err := read(); got != "hi" || err != nil {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}
	if err := p.SetClosed(true); err != nil {
		t.Fatal(err)
	}
	if _, err := read(); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial to a closed proxy: %v, want connection refused", err)
	}
	if err := p.SetClosed(false); err != nil {
		t.Fatal(err)
	}
	if got, err := read(); got != "hi" || err != nil {
		t.Fatalf("through the reopened proxy: %q, %v", got, err)
	}
}
