// Package docs holds the repository's documentation; its tests check the links and that
// the configuration reference names everything the code reads.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	slugDrop  = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
)

// slug is GitHub's anchor for a heading: lowercased, punctuation dropped, spaces to dashes.
func slug(heading string) string {
	s := slugDrop.ReplaceAllString(strings.ToLower(strings.TrimSpace(heading)), "")
	return strings.ReplaceAll(s, " ", "-")
}

// anchors lists the heading anchors of a Markdown file (outside code blocks).
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		if m := mdHeading.FindStringSubmatch(line); m != nil {
			out[slug(m[1])] = true
		}
	}
	return out
}

// TestLinksStayInTheRepository: every relative link in the README and docs/ names a file or
// directory of this checkout, and a link with an anchor names a heading of that file; none
// leaves the checkout (a reader of the repository alone can follow them all).
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
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, anchor, _ := strings.Cut(target, "#")
			p := f
			if target != "" {
				p = filepath.Clean(filepath.Join(filepath.Dir(f), target))
			}
			rel, err := filepath.Rel(root, p)
			if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
				t.Errorf("%s links outside the repository: %s", filepath.Base(f), m[1])
				continue
			}
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s links to a missing file: %s", filepath.Base(f), m[1])
				continue
			}
			if anchor == "" || !strings.HasSuffix(p, ".md") {
				continue
			}
			body, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !anchors(string(body))[anchor] {
				t.Errorf("%s links to a missing heading: %s", filepath.Base(f), m[1])
			}
		}
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Stores: what passes bucket-check":          "stores-what-passes-bucket-check",
		"The operator's console":                    "the-operators-console",
		"The fault campaign (tests/chaos)":          "the-fault-campaign-testschaos",
		"Directive `lchat` (`http.handlers.lchat`)": "directive-lchat-httphandlerslchat",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}
