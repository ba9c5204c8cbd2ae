package spacestore

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// allocate sizes a file a restore is about to fill to size bytes, allocating its blocks in
// one call where the filesystem can: ext4 then maps each page written to a block that
// exists rather than reserving a delayed allocation per page, which took about a quarter
// of the kernel time of writing a 56 MB database (12.5 ms against 9 ms, file removal
// included). A filesystem without fallocate gets a sparse file, as before.
func allocate(f *os.File, size int64) error {
	if size > 0 {
		err := unix.Fallocate(int(f.Fd()), 0, 0, size)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
			return err
		}
	}
	return f.Truncate(size)
}
