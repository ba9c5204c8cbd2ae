package durbench

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clockTick is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// procStat is one line of /proc/<pid>/stat: the parent, and the CPU (user plus system)
// the process used, and its reaped children's.
type procStat struct {
	ppid             int
	cpu, childrenCPU time.Duration
}

func readProcStat(pid int) (procStat, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, false
	}
	// The command name, in parentheses, may hold spaces: the fields follow its last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 15 {
		return procStat{}, false
	}
	n := func(k int) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v } // field k+3 of proc(5)
	ppid := int(n(1))
	return procStat{ppid: ppid, cpu: time.Duration(n(11)+n(12)) * clockTick, childrenCPU: time.Duration(n(13)+n(14)) * clockTick}, true
}

// cpuParts names the processes whose CPU the throughput phase counts.
type cpuParts struct {
	holder, other, bucket int // lchat-caddy pids and the versitygw's
}

// cpuSample is the CPU used so far, by part: "holder box", "holder's instances" (its
// descendants, live and reaped), "standby box" (with its descendants), "bucket server",
// "writers" (this test process: the 64 writers and the bucket link).
type cpuSample map[string]time.Duration

// cpuPartNames is cpuSample's keys in the order they are printed.
var cpuPartNames = []string{"holder box", "holder's instances", "standby box", "bucket server", "writers and link"}

func (p cpuParts) sample() cpuSample {
	stats := map[int]procStat{}
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readProcStat(pid); ok {
			stats[pid] = st
			children[st.ppid] = append(children[st.ppid], pid)
		}
	}
	var below func(pid int) time.Duration // the descendants' CPU, the reaped ones' included
	below = func(pid int) time.Duration {
		d := stats[pid].childrenCPU
		for _, c := range children[pid] {
			d += stats[c].cpu + below(c)
		}
		return d
	}
	return cpuSample{
		"holder box":         stats[p.holder].cpu,
		"holder's instances": below(p.holder),
		"standby box":        stats[p.other].cpu + below(p.other),
		"bucket server":      stats[p.bucket].cpu + below(p.bucket),
		"writers and link":   stats[os.Getpid()].cpu,
	}
}

// add adds b - a to s.
func (s cpuSample) add(a, b cpuSample) {
	for k := range b {
		s[k] += b[k] - a[k]
	}
}

// perWrite formats s's parts, and their sum, in microseconds per write.
func (s cpuSample) perWrite(writes int) []string {
	var out []string
	var all time.Duration
	for _, k := range cpuPartNames {
		all += s[k]
		out = append(out, fmt.Sprintf("%.0f", float64(s[k].Microseconds())/float64(max(writes, 1))))
	}
	return append(out, fmt.Sprintf("%.0f", float64(all.Microseconds())/float64(max(writes, 1))))
}

// splitCPUs, for LCHAT_DUR_CPUS=split, pins the holder box (and the instances it starts
// from then on) to CPU 0 and everything else the figures run (the standby box, the bucket
// server, this test's writers and link) to the other CPUs, as in a fleet where the
// clients, the standby and the bucket are other machines: the holder's own CPU then bounds
// every kind's throughput. It reports whether it pinned.
func splitCPUs(t *testing.T, p cpuParts) bool {
	if os.Getenv("LCHAT_DUR_CPUS") != "split" {
		return false
	}
	if runtime.NumCPU() < 2 {
		t.Fatalf("LCHAT_DUR_CPUS=split needs 2 CPUs, this machine has %d", runtime.NumCPU())
	}
	rest := fmt.Sprintf("1-%d", runtime.NumCPU()-1)
	for _, pin := range []struct {
		cpus string
		pid  int
	}{{"0", p.holder}, {rest, p.other}, {rest, p.bucket}, {rest, os.Getpid()}} {
		// -a: every thread of the process; a process it starts later inherits its mask.
		if out, err := exec.Command("taskset", "-a", "-p", "-c", pin.cpus, strconv.Itoa(pin.pid)).CombinedOutput(); err != nil {
			t.Fatalf("taskset -a -p -c %s %d: %v: %s", pin.cpus, pin.pid, err, out)
		}
	}
	return true
}
