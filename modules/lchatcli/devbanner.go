package lchatcli

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
)

// devBanner is what `lchat-caddy dev` prints once it runs: where its state is, its URLs,
// and commands that work as printed (self is how this binary is run again, selfCommand).
// notIsolated, when set, is why the demo space does not run under its own uid, printed
// first.
func devBanner(w io.Writer, self, dir, port, admin string, notIsolated error) {
	if notIsolated != nil {
		fmt.Fprintf(w, `
Isolation off: the demo space runs as this user (root), not under its own uid:
  %v
`, notIsolated)
	}
	fmt.Fprintf(w, `
lchat-caddy dev is running (state in %s)

  demo space:   http://%s:%s/
  console:      http://%s:%s/
  admin API:    http://%s/lchat/status

Add a space:    %s add-instance chat.localhost --kind demo --address %s
                then open http://chat.localhost:%s/
List routes:    %s routes --address %s

Ctrl-C saves every awake space to the bucket and exits.

`, dir, demoHost, port, consoleHost, port, admin, self, admin, port, self, admin)
}

// selfCommand is the command that runs this binary again from the current directory, for
// the commands dev prints: the path it was invoked by (os.Args[0]: as typed when it holds
// a slash or names this binary on PATH, else the absolute path), or, for a binary `go run`
// built in its temporary directory (which is gone once it exits), `go run` and the
// package ("go run ./cmd/lchat-caddy" inside the module's tree).
func selfCommand() string {
	exe, err := os.Executable()
	if err != nil {
		return shellQuote(os.Args[0])
	}
	if goRunBuild(exe) {
		if cmd, ok := goRunCommand(); ok {
			return cmd
		}
	}
	arg0 := os.Args[0]
	if strings.Contains(arg0, "/") {
		return shellQuote(arg0)
	}
	if p, err := exec.LookPath(arg0); err == nil && sameFile(p, exe) {
		return shellQuote(arg0)
	}
	return shellQuote(exe)
}

// goRunBuild reports whether exe is where `go run` puts the binary it builds:
// $GOTMPDIR (or $TMPDIR)/go-build<random>/b001/exe/<name>.
func goRunBuild(exe string) bool {
	d := filepath.Dir(exe)
	return filepath.Base(d) == "exe" && strings.HasPrefix(filepath.Base(filepath.Dir(filepath.Dir(d))), "go-build")
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
				return "go run " + shellQuote(rel), true
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

// shellQuote quotes s for a POSIX shell when it holds anything but plain path characters.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./-+:@=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
