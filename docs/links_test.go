// Package docs holds the repository's documentation; its test checks the links.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinksStayInTheRepository: every relative link in the README and docs/ names a file or
// directory of this checkout; none leaves it (a reader of the repository alone can follow
// them all).
func TestLinksStayInTheRepository(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"))
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(text), -1) {
			target := m[1]
			if strings.HasPrefix(target, "#") || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			p := filepath.Clean(filepath.Join(filepath.Dir(f), target))
			rel, err := filepath.Rel(root, p)
			if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
				t.Errorf("%s links outside the repository: %s", filepath.Base(f), m[1])
				continue
			}
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s links to a missing file: %s", filepath.Base(f), m[1])
			}
		}
	}
}
