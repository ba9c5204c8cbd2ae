package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

var (
	envName       = regexp.MustCompile(`^LCHAT_[A-Z0-9_]+$`)
	caddyfileVars = regexp.MustCompile(`\{(?:\$|env\.)(LCHAT_[A-Z0-9_]+)`)
)

// TestConfigurationReferenceNamesEverything: every Caddyfile subdirective our modules
// parse, and every LCHAT_ variable the server, the CLI or a shipped Caddyfile reads, is
// named in docs/configuration.md. A new option added without its reference fails here.
func TestConfigurationReferenceNamesEverything(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	ref, err := os.ReadFile(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := func(name string) bool {
		return regexp.MustCompile(`(^|[^A-Za-z0-9_])` + regexp.QuoteMeta(name) + `($|[^A-Za-z0-9_])`).Match(ref)
	}
	directives := caddyfileDirectives(t, root)
	if len(directives) < 50 {
		t.Fatalf("found only %d directives in modules/: the scan is broken", len(directives))
	}
	for _, d := range directives {
		if !named(d) {
			t.Errorf("directive %q is parsed by modules/ but not in docs/configuration.md", d)
		}
	}
	vars := serverEnv(t, root)
	if len(vars) < 15 {
		t.Fatalf("found only %d variables: the scan is broken", len(vars))
	}
	for _, v := range vars {
		if !named(v) {
			t.Errorf("environment variable %s is read but not in docs/configuration.md", v)
		}
	}
}

// caddyfileDirectives lists the string cases of the modules' Caddyfile parsers.
func caddyfileDirectives(t *testing.T, root string) []string {
	seen := map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(root, "modules", "*", "caddyfile*.go"))
	more, _ := filepath.Glob(filepath.Join(root, "modules", "*", "*", "caddyfile*.go"))
	for _, f := range append(files, more...) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			cc, ok := n.(*ast.CaseClause)
			if !ok {
				return true
			}
			for _, e := range cc.List {
				if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil && s != "" {
						seen[s] = true
					}
				}
			}
			return true
		})
	}
	return sorted(seen)
}

// serverEnv lists the LCHAT_ variables named in non-test Go code outside tests/, tools/
// and the test-helper packages (*test/; test-only switches are LCHAT_TEST_*), and those the shipped Caddyfiles read.
func serverEnv(t *testing.T, root string) []string {
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			switch base := d.Name(); {
			case rel == "tests" || rel == "tools" || rel == "bin" || rel == ".git":
				return filepath.SkipDir
			case strings.HasSuffix(base, "test") && rel != ".": // boxtest, buckettest: test helpers
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go"):
			file, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(file, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil && envName.MatchString(s) && !strings.HasPrefix(s, "LCHAT_TEST_") {
						seen[s] = true
					}
				}
				return true
			})
		case strings.HasPrefix(rel, "caddyfiles"+string(filepath.Separator)) && (strings.HasSuffix(p, ".Caddyfile") || strings.HasSuffix(p, ".caddy")):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range caddyfileVars.FindAllStringSubmatch(string(b), -1) {
				seen[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sorted(seen)
}

func sorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
