// Package selfcmd is how a program names itself in the commands it prints for a person
// to type (lchat-caddy dev's banner): the path it was invoked by, or `go run` and its
// package when `go run` built it, since that binary's path means nothing once it exits.
// It imports nothing but the standard library, so a small test program can use it.
package selfcmd

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
)

// Command is the command that runs this binary again from the current directory, for
// the commands dev prints: the path it was invoked by (os.Args[0]: as typed when it holds
// a slash or names this binary on PATH, else the absolute path), or, for a binary `go run`
// built in its temporary directory (which is gone once it exits), `go run` and the
// package ("go run ./cmd/lchat-caddy" inside the module's tree).
func Command() string {
	exe, err := os.Executable()
	if err != nil {
		return ShellQuote(os.Args[0])
	}
	if GoRun(exe) {
		if cmd, ok := goRunCommand(); ok {
			return cmd
		}
	}
	arg0 := os.Args[0]
	if strings.Contains(arg0, "/") {
		return ShellQuote(arg0)
	}
	if p, err := exec.LookPath(arg0); err == nil && sameFile(p, exe) {
		return ShellQuote(arg0)
	}
	return ShellQuote(exe)
}

// GoRun reports whether exe is where `go run` puts the binary it runs: the one it
// builds, $GOTMPDIR (or $TMPDIR)/go-build<random>/b001/exe/<name>, or, once that is
// cached (Go 1.24 and later: every run after the first), Go's build cache entry,
// $GOCACHE/<xx>/<xx...: 64 hex digits>-d/<name>.
func GoRun(exe string) bool {
	d := filepath.Dir(exe)
	if filepath.Base(d) == "exe" && strings.HasPrefix(filepath.Base(filepath.Dir(filepath.Dir(d))), "go-build") {
		return true
	}
	entry, shard := filepath.Base(d), filepath.Base(filepath.Dir(d))
	hash, ok := strings.CutSuffix(entry, "-d")
	return ok && len(hash) == 64 && isHex(hash) && len(shard) == 2 && strings.HasPrefix(hash, shard)
}

func isHex(s string) bool {
	return strings.Trim(s, "0123456789abcdef") == ""
}

// goRunCommand is `go run` and this binary's main package: a path relative to the
// current directory when that is inside the main module's tree, else the package's
// import path (with its version when it has a real one).
func goRunCommand() (string, bool) {
	bi, ok := debug.ReadBuildInfo()
	if !ok || bi.Path == "" {
		return "", false
	}
	if cwd, err := os.Getwd(); err == nil {
		if root, ok := moduleRoot(cwd, bi.Main.Path); ok {
			pkg := filepath.Join(root, strings.TrimPrefix(bi.Path, bi.Main.Path))
			if rel, err := filepath.Rel(cwd, pkg); err == nil {
				if !strings.HasPrefix(rel, ".") {
					rel = "./" + rel
				}
				return "go run " + ShellQuote(rel), true
			}
		}
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" && !strings.Contains(v, "+") {
		return "go run " + bi.Path + "@" + v, true
	}
	return "go run " + bi.Path, true
}

// moduleRoot finds the directory at or above dir whose go.mod declares module mod.
func moduleRoot(dir, mod string) (string, bool) {
	for {
		if f, err := os.Open(filepath.Join(dir, "go.mod")); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if fields := strings.Fields(sc.Text()); len(fields) == 2 && fields[0] == "module" {
					f.Close()
					if strings.Trim(fields[1], `"`) == mod {
						return dir, true
					}
					return "", false
				}
			}
			f.Close()
			return "", false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// ShellQuote quotes s for a POSIX shell when it holds anything but plain path characters.
func ShellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./-+:@=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
