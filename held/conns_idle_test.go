package held

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/connhold"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/internal/testwait"
)

// When a space's instance ends (a sleep or a crash), the box closes the connections it
// kept alive to the instance's socket at once: a space that stays asleep must not hold
// descriptors in the box until its next event.
func TestEndedInstanceLeavesNoKeptConnection(t *testing.T) {
	for _, end := range []string{engine.EventSleep, engine.EventCrash} {
		t.Run(end, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "s.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			open := 0
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write([]byte("ok"))
			})}
			srv.ConnState = func(_ net.Conn, s http.ConnState) {
				mu.Lock()
				defer mu.Unlock()
				switch s {
				case http.StateNew:
					open++
				case http.StateClosed, http.StateHijacked:
					open--
				}
			}
			go srv.Serve(ln)
			defer srv.Close()

			c := &Conns{log: zap.NewNop(), clients: make(map[string]*connhold.EventClient),
				wakes: make(map[string]chan struct{}), controls: make(map[string]*http.Server), lastCkptOK: make(map[string]bool)}
			hub, err := connhold.NewHub(connhold.Limits{}, c, nil)
			if err != nil {
				t.Fatal(err)
			}
			c.hub = hub
			defer hub.Shutdown(context.Background(), connhold.CloseServiceRestart)

			cl := c.client("s1", sock)
			if _, err := connhold.PostEvent(context.Background(), cl, "http://s1",
				connhold.Event{ConnID: "c", Seq: 1, Kind: connhold.KindText, Payload: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			if cl.Idle() != 1 {
				t.Fatalf("after an event: %d kept connections, want 1", cl.Idle())
			}
			c.observe(engine.Event{Type: end, Host: "s1", At: time.Now()})
			if cl.Idle() != 0 {
				t.Fatalf("after the instance's %s: %d kept connections, want 0", end, cl.Idle())
			}
			testwait.WaitFor(t, 10*time.Second, "the instance to see no open connection from the box", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return open == 0
			})
		})
	}
}
