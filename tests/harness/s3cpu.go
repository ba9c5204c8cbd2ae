package harness

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU is the CPU time (user + system) the versitygw process has used so far, in clock
// ticks of 10 ms; 0 when it cannot be read. Benchmarks subtract two readings over many
// requests to count the server's share of the work.
func (s *S3) CPU() time.Duration {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(s.cmd.Process.Pid) + "/stat")
	if err != nil {
		return 0
	}
	st := string(raw)
	i := strings.LastIndexByte(st, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(st[i+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+k) * 10 * time.Millisecond
}
