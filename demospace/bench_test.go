package demospace

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func benchSpace(b *testing.B) *http.Client {
	sock := filepath.Join(b.TempDir(), "s.sock")
	if len(sock) > 100 {
		b.Skip("temp path too long for a Unix socket")
	}
	srv, err := New(Config{Socket: sock, DataDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx); close(done) }()
	b.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
		}
	})
	return unixClient(sock)
}

// BenchmarkPostMessage is one POST /api/messages over the Unix socket: JSON
// decode, validation, a durable SQLite insert (WAL, synchronous=NORMAL).
func BenchmarkPostMessage(b *testing.B) {
	c := benchSpace(b)
	for b.Loop() {
		resp, err := c.Post("http://space.test/api/messages", "application/json", strings.NewReader(`{"author":"ada","text":"benchmark"}`))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
}

// BenchmarkListMessages is GET /api/messages (the latest 100) on a room of
// 1000 messages.
func BenchmarkListMessages(b *testing.B) {
	c := benchSpace(b)
	for range 1000 {
		resp, err := c.Post("http://space.test/api/messages", "application/json", strings.NewReader(`{"author":"ada","text":"a message of ordinary length for a chat room"}`))
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
	}
	for b.Loop() {
		resp, err := c.Get("http://space.test/api/messages")
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
