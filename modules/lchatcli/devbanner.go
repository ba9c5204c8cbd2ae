package lchatcli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/lchat/lchat-caddy/modules/lchat"
)

// banner is what `lchat-caddy dev` says once it runs (devBanner).
type banner struct {
	// Self is how this binary is run again (selfcmd.Command); GoRun, that it is a go run build.
	Self  string
	GoRun bool
	// Dir is dev's state directory; Port its HTTP port; Admin its admin API address.
	Dir, Port, Admin string
	// Suggest is a host to add that does not exist yet (freeHost).
	Suggest string
	// NotIsolated is why the demo space does not run under its own uid (nil: it does, or
	// it is not meant to), printed first.
	NotIsolated error
	// Helpers are the notes of missingHelpers.
	Helpers []string
	// LogLevel is the level of the logs that follow the banner on stderr.
	LogLevel string
}

// devBanner writes bn to w: where dev's state is, its URLs, commands that work as
// printed, and what is slower or off than on a real box and why.
func devBanner(w io.Writer, bn banner) {
	if bn.NotIsolated != nil {
		fmt.Fprintf(w, `
Isolation off: the demo space runs as this user (root), not under its own uid:
  %v
`, bn.NotIsolated)
	}
	self, admin := bn.Self, bn.Admin
	fmt.Fprintf(w, `
lchat-caddy dev is running (state in %s)

  demo space:   http://%s:%s/
  console:      http://%s:%s/
  admin API:    http://%s/lchat/status

Add a space:    %s add-instance %s --kind demo --address %s
                then open http://%s:%s/
Spaces:         %s status --address %s
List routes:    %s routes --address %s
Sleep a space:  %s sleep %s --address %s   (wake likewise)
`, bn.Dir, demoHost, bn.Port, consoleHost, bn.Port, admin, self, bn.Suggest, admin, bn.Suggest, bn.Port,
		self, admin, self, admin, self, demoHost, admin)
	if bn.GoRun {
		fmt.Fprint(w, `
Run through go run: each command above builds again (from Go's cache), and go reports
a command's failure as "exit status N" and exits 1, whatever the command's own exit
code (docs/cli.md). scripts/build && bin/lchat-caddy dev runs the binaries a box runs.
`)
	}
	for _, h := range bn.Helpers {
		fmt.Fprintf(w, "\n%s\n", h)
	}
	level := "warnings and errors"
	switch bn.LogLevel {
	case "debug":
		level = "everything, the admin API's requests included"
	case "info":
		level = "info and above (--log-level debug adds the admin API's requests)"
	case "error":
		level = "errors"
	}
	fmt.Fprintf(w, `
Logs follow on stderr: %s.
Ctrl-C saves every awake space to the bucket and exits.

`, level)
}

// freeHost is the host the banner suggests adding: chat.localhost, else chat2.localhost,
// chat3.localhost, ..., the first that exists returns false for.
func freeHost(exists func(string) bool) string {
	h := "chat.localhost"
	for i := 2; exists(h); i++ {
		h = fmt.Sprintf("chat%d.localhost", i)
	}
	return h
}

// missingHelpers says what a box built with scripts/build would have beside exe and
// this one lacks: lchat-demo-space (without it the demo space runs as this binary's
// demo-space alias, each wake paying Caddy's package inits). A missing lchat-pageread
// needs no note of its own: without it the engine does not isolate the demo space, and
// the banner's first lines say so, naming it (banner.NotIsolated).
func missingHelpers(exe string) []string {
	if executable(filepath.Join(filepath.Dir(exe), lchat.DemoSpaceBinary)) {
		return nil
	}
	return []string{fmt.Sprintf(`Slower wakes: %s is not beside this binary, so the demo space runs as
its demo-space alias (Caddy's package inits on every wake: ~50 ms, not ~7 ms).
scripts/build puts it there.`, lchat.DemoSpaceBinary)}
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
