package engine

import "github.com/lchat/lchat-caddy/sandbox"

// SpaceMemory is the memory one awake space takes.
type SpaceMemory struct {
	Host  string
	Bytes int64
}

// Memory reads the memory of every awake space: its cgroup's (sandbox.Group.MemoryBytes),
// or, for an instance without one, its process's resident memory. A space whose reading
// fails (its process just exited) is left out. The cost is one or two small file reads
// per awake space; the box reads it once per heartbeat.
func (e *Engine) Memory() []SpaceMemory {
	all := e.all()
	out := make([]SpaceMemory, 0, len(all))
	for _, in := range all {
		in.mu.Lock()
		p := in.proc
		awake := in.state == StateAwake
		in.mu.Unlock()
		if !awake || p == nil {
			continue
		}
		var n int64
		var err error
		if p.group != nil {
			n, err = p.group.MemoryBytes()
		} else {
			n, err = sandbox.ProcRSS(p.pid)
		}
		if err == nil {
			out = append(out, SpaceMemory{Host: in.host, Bytes: n})
		}
	}
	return out
}
