package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
)

// DefaultUIDFirst and DefaultUIDCount are the uid range spaces get unless configured:
// far above login users (1000+), systemd's dynamic users (61184-65519) and the usual
// /etc/subuid blocks (100000 + 65536 per user).
const (
	DefaultUIDFirst = 3_000_000
	DefaultUIDCount = 65536
)

// UIDs allocates one unprivileged uid (and the gid of the same number) per space host
// from a range, and remembers it in a file so a host keeps its uid across restarts. A
// host's first choice is a hash of its name into the range; a taken slot, or a uid that
// belongs to an account in the user database, probes the next one. A uid is never given
// to another host, even after its host is removed: files the old space left behind
// (in /tmp, say) must not become readable by a newcomer.
type UIDs struct {
	path         string
	first, count uint32
	taken        func(uid uint32) bool // a uid of an existing account; tests replace it

	mu    sync.Mutex
	hosts map[string]uint32 // guarded by mu; persisted to path
	used  map[uint32]string // guarded by mu
}

// OpenUIDs loads (or starts) the allocation file at path for the range [first,
// first+count). The range may not include 0.
func OpenUIDs(path string, first, count uint32) (*UIDs, error) {
	if first == 0 || count == 0 || uint64(first)+uint64(count) > 1<<32-1 {
		return nil, fmt.Errorf("uid range %d+%d: must be non-empty, above 0 and below 2^32-1", first, count)
	}
	u := &UIDs{path: path, first: first, count: count, taken: accountExists,
		hosts: map[string]uint32{}, used: map[uint32]string{}}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("reading uid allocations: %v", err)
	default:
		if err := json.Unmarshal(data, &u.hosts); err != nil {
			return nil, fmt.Errorf("reading uid allocations %s: %v", path, err)
		}
		for h, id := range u.hosts {
			u.used[id] = h
		}
	}
	return u, nil
}

// For returns host's uid, allocating and persisting it on first use. A host allocated
// under another range keeps its uid.
func (u *UIDs) For(host string) (uint32, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if id, ok := u.hosts[host]; ok {
		return id, nil
	}
	h := fnv.New64a()
	h.Write([]byte(host))
	start := uint32(h.Sum64() % uint64(u.count))
	for i := range u.count {
		id := u.first + (start+i)%u.count
		if _, used := u.used[id]; used || u.taken(id) {
			continue
		}
		u.hosts[host] = id
		u.used[id] = host
		if err := u.saveLocked(); err != nil {
			delete(u.hosts, host)
			delete(u.used, id)
			return 0, err
		}
		return id, nil
	}
	return 0, fmt.Errorf("uid range %d+%d is exhausted", u.first, u.count)
}

func (u *UIDs) saveLocked() error {
	data, err := json.Marshal(u.hosts)
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(u.path), "."+filepath.Base(u.path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("saving uid allocations: %v", err)
	}
	if err := os.Rename(tmp, u.path); err != nil {
		return fmt.Errorf("saving uid allocations: %v", err)
	}
	return nil
}

func accountExists(uid uint32) bool {
	id := strconv.FormatUint(uint64(uid), 10)
	if _, err := user.LookupId(id); err == nil {
		return true
	}
	_, err := user.LookupGroupId(id)
	return err == nil
}
