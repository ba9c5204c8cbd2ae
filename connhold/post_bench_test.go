package connhold

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
)

// BenchmarkPostEvent is one event's HTTP round trip to an instance over a Unix socket,
// the hop a held connection adds to each message.
func BenchmarkPostEvent(b *testing.B) {
	sock := filepath.Join(b.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("echo")) })}
	go srv.Serve(ln)
	defer srv.Close()
	var d net.Dialer
	cl := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "unix", sock)
	}}}
	ev := Event{ConnID: NewID(), Seq: 1, Kind: KindText, Payload: []byte("x")}
	b.ResetTimer()
	for b.Loop() {
		if _, err := PostEvent(context.Background(), cl, "http://s1", ev); err != nil {
			b.Fatal(err)
		}
	}
}
