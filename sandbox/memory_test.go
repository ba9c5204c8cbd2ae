package sandbox

import (
	"os"
	"testing"
)

// TestProcRSS: this process has resident memory, and a process that is gone is an error.
func TestProcRSS(t *testing.T) {
	n, err := ProcRSS(os.Getpid())
	if err != nil || n <= 0 {
		t.Fatalf("ProcRSS(self) = %d, %v", n, err)
	}
	if _, err := ProcRSS(1 << 30); err == nil {
		t.Fatal("ProcRSS of no process: no error")
	}
	if m, err := BoxMemory(); err != nil || m < n {
		t.Fatalf("BoxMemory = %d, %v (this process alone has %d)", m, err, n)
	}
}

// BenchmarkProcRSS is the cost of reading one awake space's memory without a cgroup (a
// cgroup's memory.current is one read of the same size); a beat reads one per awake space.
func BenchmarkProcRSS(b *testing.B) {
	pid := os.Getpid()
	for b.Loop() {
		if _, err := ProcRSS(pid); err != nil {
			b.Fatal(err)
		}
	}
}
