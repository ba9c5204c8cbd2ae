package lchatcli

import (
	"io/fs"
	"os"
	"testing"
	"time"
)

type fakeInfo struct{ mode fs.FileMode }

func (f fakeInfo) Name() string       { return "admin.sock" }
func (f fakeInfo) Size() int64        { return 0 }
func (f fakeInfo) Mode() fs.FileMode  { return f.mode }
func (f fakeInfo) ModTime() time.Time { return time.Time{} }
func (f fakeInfo) IsDir() bool        { return false }
func (f fakeInfo) Sys() any           { return nil }

func TestCLIFindsTheAdminSocketByDefault(t *testing.T) {
	socket := func(string) (os.FileInfo, error) { return fakeInfo{os.ModeSocket | 0o600}, nil }
	missing := func(string) (os.FileInfo, error) { return nil, os.ErrNotExist }
	env := func(v string) func(string) string {
		return func(n string) string {
			if n == "LCHAT_ADMIN_LISTEN" {
				return v
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name, address, envVal string
		stat                  func(string) (os.FileInfo, error)
		want                  string
	}{
		{"the shipped socket", "", "", socket, "unix//run/lchat-caddy/admin.sock"},
		{"no socket: Caddy's default", "", "", missing, "localhost:2019"},
		{"LCHAT_ADMIN_LISTEN, as the Caddyfiles read it", "", "unix//tmp/a.sock|0600", socket, "unix//tmp/a.sock|0600"},
		{"--address wins", "127.0.0.1:2999", "unix//tmp/a.sock", socket, "127.0.0.1:2999"},
	} {
		got, err := resolveAdminAddress(tc.address, "", "", env(tc.envVal), tc.stat)
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}
