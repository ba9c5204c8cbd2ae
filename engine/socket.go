package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// proxyPath is where the box dials a space: a hard link, in a directory only the box can
// write, to the socket the instance bound. The instance owns its own socket directory, so
// the path it listens on may at any moment be a symlink to something only the box may
// reach (the admin socket); dialing it would hand the box's privileges to the space.
func proxyPath(stateDir, host string) string {
	sum := sha256.Sum256([]byte(host))
	return filepath.Join(stateDir, "proxy", hex.EncodeToString(sum[:8])+".sock")
}

// ControlSocketPath is where the box serves host's control endpoint for held connections
// (docs/connections.md), in a directory only the box writes; the instance gets it as
// LCHAT_CONTROL_SOCKET. The box checks each caller's uid (SO_PEERCRED) against the
// instance's (InstanceUID).
func ControlSocketPath(stateDir, host string) string {
	sum := sha256.Sum256([]byte(host))
	return filepath.Join(stateDir, "control", hex.EncodeToString(sum[:8])+".sock")
}

// InstanceUID is the uid host's instance runs as (the box's own when it is not isolated),
// and false when no instance runs here.
func (e *Engine) InstanceUID(host string) (int, bool) {
	in := e.lookup(host)
	if in == nil {
		return 0, false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.proc == nil || in.state != StateAwake {
		return 0, false
	}
	return in.proc.uid, true
}

// errSocketMissing means the instance has not bound its socket yet.
var errSocketMissing = errors.New("instance socket not bound yet")

// pinSocket links the instance's socket into the proxy directory once it is what the
// instance itself bound: a socket (not a symlink or anything else) owned by uid. The link
// is made from a descriptor of the checked file, never from the path again, so a swap
// after the check changes nothing.
func (in *inst) pinSocket(uid int) error {
	fd, err := unix.Open(in.socket, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return errSocketMissing
	}
	if err != nil {
		return fmt.Errorf("opening instance socket: %v", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("checking instance socket: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || int(st.Uid) != uid {
		return fmt.Errorf("%s is not a socket of uid %d (mode %o, owner %d): refusing to proxy to it", in.socket, uid, st.Mode, st.Uid)
	}
	if err := os.MkdirAll(filepath.Dir(in.link), 0o700); err != nil {
		return err
	}
	if err := os.Remove(in.link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// linkat through /proc/self/fd follows the descriptor to the checked inode.
	if err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, in.link, unix.AT_SYMLINK_FOLLOW); err != nil {
		return fmt.Errorf("linking instance socket for the proxy (a box that is not root needs CAP_FOWNER): %v", err)
	}
	return nil
}

// unpinSocket removes the proxy's link; the next wake pins the new socket.
func (in *inst) unpinSocket() {
	os.Remove(in.link)
}
