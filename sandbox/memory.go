package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MemoryBytes is what the group's processes take of the box's memory: the memory
// controller's own count where the group has one (v2 memory.current, v1
// memory.usage_in_bytes: resident memory and the page cache charged to the group), else the
// resident memory of its processes (ProcRSS of each).
func (g *Group) MemoryBytes() (int64, error) {
	if g.c.v2ctrl[ctrlMemory] && g.v2 != "" {
		if n, err := readInt(filepath.Join(g.v2, "memory.current")); err == nil {
			return n, nil
		}
	}
	if dir := g.c.v1[ctrlMemory]; dir != "" {
		if n, err := readInt(filepath.Join(dir, g.c.name, g.name, "memory.usage_in_bytes")); err == nil {
			return n, nil
		}
	}
	var sum int64
	for _, pid := range g.Pids() {
		n, err := ProcRSS(pid)
		if err != nil {
			continue // exited between the listing and the read
		}
		sum += n
	}
	return sum, nil
}

// ProcRSS is the resident memory of process pid, from /proc/<pid>/statm.
func ProcRSS(pid int) (int64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(data))
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/statm: %q", pid, data)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/statm: %v", pid, err)
	}
	return pages * int64(os.Getpagesize()), nil
}

// BoxMemory is the memory this process may use: the host's MemTotal, or the limit of the
// process's own cgroup (v2 memory.max, up the tree) when that is lower, as a container or
// a systemd MemoryMax= sets it.
func BoxMemory() (int64, error) {
	total, err := memTotal("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	if limit, ok := ownMemoryMax(); ok && limit < total {
		return limit, nil
	}
	return total, nil
}

// memTotal reads MemTotal from a meminfo file.
func memTotal(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("MemTotal:")); ok {
			fs := strings.Fields(string(v))
			if len(fs) == 0 {
				break
			}
			kb, err := strconv.ParseInt(fs[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: MemTotal: %v", path, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New(path + ": no MemTotal")
}

// ownMemoryMax is the lowest memory.max on the path of this process's v2 cgroup, when the
// unified tree is mounted at /sys/fs/cgroup.
func ownMemoryMax() (int64, bool) {
	own, err := readOwnCgroups("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	p, ok := own[""]
	if !ok {
		return 0, false
	}
	best, found := int64(0), false
	for dir := filepath.Join("/sys/fs/cgroup", p); strings.HasPrefix(dir, "/sys/fs/cgroup/"); dir = filepath.Dir(dir) {
		if n, err := readInt(filepath.Join(dir, "memory.max")); err == nil && (!found || n < best) {
			best, found = n, true
		}
	}
	return best, found
}

// readInt reads a file holding one integer ("max" is not one).
func readInt(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
}
