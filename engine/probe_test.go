package engine

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// TestReadinessProbe: the one readiness probe, as a wake and the first-answer watch send
// it: a ready path must answer 2xx; without one, an instance's own socket is ready once it
// accepts, while the box's own listener (socket activation) needs an answer, any answer.
func TestReadinessProbe(t *testing.T) {
	serve := func(t *testing.T, h http.HandlerFunc) string {
		sock := filepath.Join(t.TempDir(), "s.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		return sock
	}
	// silent accepts connections and never speaks: a listener whose app does not run.
	silent := func(t *testing.T) string {
		sock := filepath.Join(t.TempDir(), "s.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { c.Close() })
			}
		}()
		return sock
	}
	status := func(code int) func(*testing.T) string {
		return func(t *testing.T) string {
			return serve(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && r.URL.Path != "/ready" {
					w.WriteHeader(http.StatusNotFound)
					return
				}
				w.WriteHeader(code)
			})
		}
	}
	for _, tc := range []struct {
		name      string
		listener  func(*testing.T) string
		path      string
		activated bool
		want      bool
	}{
		{"own socket accepting", silent, "", false, true},
		{"own socket, path answering 2xx", status(http.StatusNoContent), "/ready", false, true},
		{"own socket, path answering 503", status(http.StatusServiceUnavailable), "/ready", false, false},
		{"own socket, path silent", silent, "/ready", false, false},
		{"box's listener, app silent", silent, "", true, false},
		{"box's listener, app answering 404", status(http.StatusNotFound), "", true, true},
		{"box's listener, path answering 2xx", status(http.StatusOK), "/ready", true, true},
		{"box's listener, path answering 500", status(http.StatusInternalServerError), "/ready", true, false},
		{"nothing listening", func(t *testing.T) string { return filepath.Join(t.TempDir(), "none.sock") }, "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newInstanceClient(tc.listener(t), 0)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if got := c.ready(ctx, tc.path, tc.activated); got != tc.want {
				t.Fatalf("ready = %v, want %v", got, tc.want)
			}
		})
	}
}
