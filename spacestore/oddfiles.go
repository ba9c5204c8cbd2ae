package spacestore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// An instance owns its data directory and may leave anything there: a FIFO, a socket, a
// device node or a symlink. None of them is state the bucket can hold, and reading one
// can block forever (a FIFO with no writer) or escape the directory (a symlink). The
// checkpoint skips them, counting and naming each in Stats.Skipped, and every small file
// the box itself reads from the directory (next-wake) is opened so that it can neither
// block nor follow a link.

// ErrNotRegular means a file the box reads from a data dir is not a small regular file.
var ErrNotRegular = errors.New("not a small regular file")

// oddKind names what kind of non-regular file mode describes: "" for a regular file or a
// directory (both snapshot normally).
func oddKind(mode fs.FileMode) string {
	switch {
	case mode.IsRegular(), mode.IsDir():
		return ""
	case mode&fs.ModeSymlink != 0:
		return "symlink"
	case mode&fs.ModeNamedPipe != 0:
		return "fifo"
	case mode&fs.ModeSocket != 0:
		return "socket"
	case mode&fs.ModeDevice != 0:
		return "device"
	default:
		return "irregular"
	}
}

// SkippedFile is one file a checkpoint left out because it is not a regular file.
type SkippedFile struct {
	Path string `json:"path"` // relative to the data dir, slash-separated
	Kind string `json:"kind"` // symlink, fifo, socket, device or irregular
}

// openSmallRegular opens p for reading only if it is a regular file of at most max bytes.
// The type is checked before the open (opening a socket fails, a FIFO blocks) and again on
// the open descriptor, so a file swapped in between cannot slip through: O_NONBLOCK keeps
// the open of such a FIFO from waiting for a writer and O_NOFOLLOW refuses a symlink.
func openSmallRegular(p string, max int64) (*os.File, error) {
	info, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	if err := checkSmallRegular(p, info, max); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENXIO) {
			return nil, fmt.Errorf("%s: changed while opening: %w", p, ErrNotRegular)
		}
		return nil, err
	}
	if info, err = f.Stat(); err == nil {
		err = checkSmallRegular(p, info, max)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func checkSmallRegular(p string, info fs.FileInfo, max int64) error {
	if k := oddKind(info.Mode()); k != "" || info.IsDir() {
		if k == "" {
			k = "directory"
		}
		return fmt.Errorf("%s: %s: %w", p, k, ErrNotRegular)
	}
	if info.Size() > max {
		return fmt.Errorf("%s: %d bytes: %w", p, info.Size(), ErrNotRegular)
	}
	return nil
}
