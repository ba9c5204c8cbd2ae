package bucket

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzCheckKey: an accepted key, joined under any valid prefix, stays inside a backend's
// root (a directory for the file backend) and has no ".", ".." or empty segment.
func FuzzCheckKey(f *testing.F) {
	for _, s := range []string{"spaces/a.example.com/lease", "mesh/members/aHR0cHM6Ly9h", "../x", "a/../../x", "/abs", "a//b", "a/./b", "a\x00b", "", "a/", "."} {
		f.Add(s, "fleet")
	}
	f.Fuzz(func(t *testing.T, key, prefix string) {
		p, err := CleanPrefix(prefix)
		if err != nil || CheckKey(key) != nil {
			return
		}
		for _, seg := range strings.Split(key, "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Fatalf("accepted key %q with segment %q", key, seg)
			}
		}
		root := "/srv/bucket"
		full := filepath.Join(root, filepath.FromSlash(JoinPrefix(p, key)))
		if !strings.HasPrefix(full, root+string(filepath.Separator)) {
			t.Fatalf("key %q under prefix %q lands at %s, outside %s", key, p, full, root)
		}
	})
}
