package held

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// A caller of a control endpoint whose uid is not the instance's is hung up on before
// any request is read; the instance's uid is served.
func TestControlEndpointChecksThePeerUID(t *testing.T) {
	for _, tc := range []struct {
		name  string
		allow bool
	}{{"instance's uid", true}, {"another uid", false}} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "control", "c.sock")
			ln, err := listenControl(path)
			if err != nil {
				t.Fatal(err)
			}
			me := os.Getuid()
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}
			go srv.Serve(&peerListener{Listener: ln, ok: func(uid int) bool { return tc.allow && uid == me }})
			defer srv.Close()
			cl := &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", path) }}}
			resp, err := cl.Get("http://x/.lchat/ws/conns")
			if tc.allow && (err != nil || resp.StatusCode != 200) {
				t.Fatalf("the instance's uid: %v %v", resp, err)
			}
			if !tc.allow && err == nil {
				t.Fatalf("another uid was answered %d", resp.StatusCode)
			}
			fi, err := os.Stat(filepath.Dir(path))
			if err != nil || fi.Mode().Perm() != 0o711 {
				t.Errorf("control directory mode %v, want 0711", fi.Mode().Perm())
			}
		})
	}
}
