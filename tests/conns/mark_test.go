package conns

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestSSEMarkNeverReachesAClient: the instance's Lchat-Sse mark, its word to the box, is
// taken off its answer whether or not the client asked for an event stream: a client that
// sends no Accept: text/event-stream gets the stream as a plain answer, without the mark.
func TestSSEMarkNeverReachesAClient(t *testing.T) {
	b, host := startHoldBox(t)
	for _, accept := range []string{"", "*/*", "text/event-stream"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		req, _ := http.NewRequestWithContext(ctx, "GET", b.URL(host, "/events"), nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := b.Client().Do(req)
		if err != nil {
			cancel()
			t.Fatalf("Accept %q: %v", accept, err)
		}
		resp.Body.Close() // the stream stays open; its header is what counts
		cancel()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("Lchat-Sse") != "" {
			t.Errorf("Accept %q: %d %s, Lchat-Sse %q; want the stream without the box's header",
				accept, resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("Lchat-Sse"))
		}
	}
}
