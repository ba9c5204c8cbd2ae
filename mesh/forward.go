package mesh

import (
	"net"
	"net/http"
	"net/url"
)

// Forwarding a request to a peer: the address its SELF is dialed at, and the holder its
// answer names.

// DialAddr is the host:port a box's SELF URL is dialed at: its port, else 443 for https
// and 80 for http.
func DialAddr(self *url.URL) string {
	port := self.Port()
	if port == "" {
		port = "80"
		if self.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(self.Hostname(), port)
}

// TakeHolder reads the holder a forwarded response names (HolderHeader): exactly one
// valid SELF URL, else none. hops is the number of forwards before this box: on the
// entry box (0) the header is removed, since the response leaves the mesh there.
func TakeHolder(h http.Header, hops int) (holder string, ok bool) {
	if held := h.Values(HolderHeader); len(held) == 1 {
		if self, err := ParseSelf(held[0]); err == nil {
			holder, ok = self, true
		}
	}
	if hops == 0 {
		h.Del(HolderHeader)
	}
	return holder, ok
}
