package engine

import (
	"context"
	"net"
	"net/http"
	"time"
)

// instanceClient is the box's one HTTP client of an instance, over the box's link to the
// instance's socket (never a path the instance controls): the readiness probe of a wake,
// the first-answer watch of a socket-activated start and the delivery of scheduled wakes
// all speak to the instance through one. Every request dials anew: an instance is spoken
// to seldom, and a kept connection would outlive the instance it reached.
type instanceClient struct {
	socket string
	http   *http.Client
}

// newInstanceClient returns a client of the instance listening on socket; timeout bounds
// each request (0: only the request's context does). Close it when done.
func newInstanceClient(socket string, timeout time.Duration) *instanceClient {
	return &instanceClient{socket: socket, http: &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", socket)
			},
			DisableKeepAlives: true,
		},
		Timeout: timeout,
	}}
}

// Close lets go of the client's idle connections.
func (c *instanceClient) Close() { c.http.CloseIdleConnections() }

// Do sends req to the instance.
func (c *instanceClient) Do(req *http.Request) (*http.Response, error) { return c.http.Do(req) }

// ready is the one readiness probe of an instance: it sends one probe and reports whether
// the instance answered as ready. With a ready path (Kind.ReadyPath) a GET of it must
// answer 2xx. Without one, what shows readiness depends on who listens: an instance that
// bound its socket itself is ready once the socket accepts a connection; on the box's
// own listener (activated: socket activation), which accepts whether or not the app
// runs, only an answer shows the app took the connection, and any answer to "OPTIONS *"
// will do.
func (c *instanceClient) ready(ctx context.Context, path string, activated bool) bool {
	if path == "" && !activated {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", c.socket)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	}
	method, url := http.MethodGet, "http://instance"+path
	if path == "" {
		method, url = http.MethodOptions, "http://instance"
	}
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return false
	}
	if path == "" {
		req.URL.Opaque = "*"
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return path == "" || resp.StatusCode >= 200 && resp.StatusCode < 300
}
