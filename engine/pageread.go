package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/sandbox"
	"github.com/lchat/lchat-caddy/spacestore"
)

// PageReaderEnv names the environment variable that overrides where the engine finds
// lchat-pageread (Config.PageReader wins over it).
const PageReaderEnv = "LCHAT_PAGEREAD"

// pageReaderPath is where lchat-pageread is: configured, else $LCHAT_PAGEREAD, else beside
// this executable (as installed: /usr/local/bin/lchat-caddy and lchat-pageread).
func pageReaderPath(configured string) string {
	if configured != "" {
		return configured
	}
	if p := os.Getenv(PageReaderEnv); p != "" {
		return p
	}
	exe, err := os.Executable()
	if err != nil {
		return spacestore.PageReaderName // fails at use, naming it
	}
	return filepath.Join(filepath.Dir(exe), spacestore.PageReaderName)
}

// pageReaderPresent checks that lchat-pageread is where the engine will run it: an
// isolated space's database checkpoints need it, so a kind isolated by default runs as the
// box's user without it (logged with this reason) and `isolation on` refuses to start.
func (e *Engine) pageReaderPresent() error {
	fi, err := os.Stat(e.cfg.PageReader)
	if err != nil {
		return fmt.Errorf("%s is missing (%v): isolated spaces read their SQLite databases through it; install it beside lchat-caddy or set %s", spacestore.PageReaderName, err, PageReaderEnv)
	}
	if fi.Mode().Perm()&0o001 == 0 {
		return fmt.Errorf("%s (%s) is not executable by the spaces' uids (mode %v)", spacestore.PageReaderName, e.cfg.PageReader, fi.Mode().Perm())
	}
	return nil
}

// pageReader is how checkpoints of a start under cred read the space's databases: in
// lchat-pageread under the space's uid when the instance runs under its own uid (a crafted
// database then attacks a process with the space's privileges), in the box's process when
// it runs as the box's own user (nil cred: the tenant is the box's user already).
func (e *Engine) pageReader(in *inst, cred *syscall.Credential) *spacestore.PageReader {
	if cred == nil {
		return nil
	}
	if _, err := os.Stat(e.cfg.PageReader); err != nil {
		// The wake goes on (a space may have no database); its checkpoints name the path.
		in.logger().Error("page reader missing: checkpoints of this space's SQLite databases will fail",
			zap.String("path", e.cfg.PageReader), zap.Error(err))
	}
	return &spacestore.PageReader{Path: e.cfg.PageReader, UID: cred.Uid, GID: cred.Gid,
		Timeout: e.cfg.PageReadTimeout, Start: sandbox.StartHelper}
}
