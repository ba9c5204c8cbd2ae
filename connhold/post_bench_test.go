package connhold

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
)

// echoSocket serves "echo" to every request on a Unix socket.
func echoSocket(tb testing.TB) string {
	sock := filepath.Join(tb.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("echo")) })}
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Close() })
	return sock
}

// BenchmarkPostEvent is one event's HTTP round trip to an instance over a Unix socket,
// the hop a held connection adds to each message: with the box's EventClient, and with
// net/http's Transport for comparison.
func BenchmarkPostEvent(b *testing.B) {
	sock := echoSocket(b)
	var d net.Dialer
	clients := map[string]Doer{
		"EventClient": &EventClient{Socket: sock},
		"Transport": &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", sock)
		}}},
	}
	ev := Event{ConnID: NewID(), Seq: 1, Kind: KindText, Payload: []byte("x")}
	for name, cl := range clients {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := PostEvent(context.Background(), cl, "http://s1", ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
