package spacestore

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/registry"
)

// FuzzDecodeManifest: no manifest body panics the decoder, and an accepted manifest only
// names paths inside the data dir and hashes that make valid bucket keys.
func FuzzDecodeManifest(f *testing.F) {
	sum := strings.Repeat("ab", 32)
	for _, s := range []string{
		`{"generation":1,"files":[{"path":"db.sqlite","size":3,"sha256":"` + sum + `","mode":420}]}`,
		`{"generation":2,"files":[{"path":"a/b/c","size":0,"sha256":"` + sum + `","mode":384}],"next_wake":"2030-01-01T00:00:00Z"}`,
		`{"generation":1,"files":[{"path":"../escape","size":1,"sha256":"` + sum + `"}]}`,
		`{"generation":1,"files":[{"path":"a","sha256":"` + sum + `"},{"path":"a/b","sha256":"` + sum + `"}]}`,
		`{"generation":-1}`, `{"files":null}`, `[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeManifest(data)
		if err != nil {
			return
		}
		root := "/data/space"
		for _, file := range m.Files {
			if !fs.ValidPath(file.Path) || file.Path == "." {
				t.Fatalf("accepted path %q", file.Path)
			}
			dst := filepath.Join(root, filepath.FromSlash(file.Path))
			if !strings.HasPrefix(dst, root+string(filepath.Separator)) {
				t.Fatalf("accepted path %q lands at %s, outside %s", file.Path, dst, root)
			}
			if err := bucket.CheckKey(BlobKey("h.example.com", file.SHA256)); err != nil {
				t.Fatalf("accepted sha256 %q makes an invalid key: %v", file.SHA256, err)
			}
			if file.Size < 0 {
				t.Fatalf("accepted size %d", file.Size)
			}
		}
	})
}

// FuzzReadNextWake: whatever an instance writes to next-wake, reading it neither panics
// nor returns a time alongside an error.
func FuzzReadNextWake(f *testing.F) {
	for _, s := range []string{"2030-01-02T03:04:05Z\n", "2030-01-02T03:04:05.123456789+02:00", "", "  ", "tomorrow", "\x00\xff", strings.Repeat("9", 300)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, filepath.FromSlash(NextWakeFile))
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		at, err := ReadNextWake(dir)
		if err != nil && at != nil {
			t.Fatalf("ReadNextWake returned %v with error %v", at, err)
		}
		if len(data) > nextWakeMax && err == nil {
			t.Fatalf("accepted a %d-byte next-wake", len(data))
		}
	})
}

// FuzzSpaceKeys: every host the registry accepts makes bucket keys that are valid, stay
// under spaces/<host>/ (or wakes/<host>) and name that host only.
func FuzzSpaceKeys(f *testing.F) {
	for _, s := range []string{"a.example.com", "xn--bcher-kva.example", "..", "a/../b", "a..b", "-a.b", strings.Repeat("a", 70) + ".b", "8oe.example.com"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		if registry.ValidateHost(host) != nil {
			return
		}
		for _, key := range []string{LeaseKey(host), ManifestKey(host), BlobKey(host, strings.Repeat("0", 64)), WakeKey(host)} {
			if err := bucket.CheckKey(key); err != nil {
				t.Fatalf("host %q: key %q invalid: %v", host, key, err)
			}
		}
		if seg := strings.Split(LeaseKey(host), "/"); len(seg) != 3 || seg[1] != host {
			t.Fatalf("host %q: lease key %q does not name exactly that host", host, LeaseKey(host))
		}
		if rest, ok := strings.CutPrefix(WakeKey(host), WakesPrefix); !ok || rest != host || strings.Contains(rest, "/") {
			t.Fatalf("host %q: wake key %q", host, WakeKey(host))
		}
	})
}
