package conns

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// A resumable stream whose instance has no event yet still answers the client at once:
// the header is passed on when the instance flushes it, not held back until the first
// event (or the first keepalive of a sleeping space, 15 s later), so an EventSource opens.
// The space's idle timeout is long: the header must arrive while it is awake, before any
// sleep (after which a keepalive would carry it).
func TestResumableStreamAnswersBeforeItsFirstEvent(t *testing.T) {
	const host = "empty-stream.example.com"
	b := startKindBox(t, "1m", nil, host)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.URL(host, "/soak/events"), nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := b.Client().Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("opening the stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	if c := counters(t, b); c["sleeps"] != 0 || c["wakes"] != 1 {
		t.Fatalf("the stream's header arrived after %d sleeps (wakes %d): it waited for a keepalive", c["sleeps"], c["wakes"])
	}
	if st, _ := spaceState(t, b, host); st != "awake" {
		t.Fatalf("the space is %s, want awake", st)
	}
}
