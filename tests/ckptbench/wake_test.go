package ckptbench

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestWakeLoop restores a large database in both formats over and over, for profiling the
// wake path (opt-in):
//
//	LCHAT_WAKE_LOOP=30 go test ./tests/ckptbench -run TestWakeLoop -v -cpuprofile cpu.out
//
// The value is the number of checkpoints (one row each) before the restores; with
// LCHAT_WAKE_FINAL=1 a sleep's final checkpoint folds the chain first.
func TestWakeLoop(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("LCHAT_WAKE_LOOP"))
	if n == 0 {
		t.Skip("set LCHAT_WAKE_LOOP=<checkpoints> to run")
	}
	s3 := harness.StartS3(t)
	cb := &counting{Bucket: s3.NewBucket(t, "bench/")}
	big := filepath.Join(t.TempDir(), "big.db")
	makeDB(t, big, 50<<20)
	v1 := newBox(t, cb, "full-file", "v1.bench", big, true)
	v2 := newBox(t, cb, "page-delta", "v2.bench", big, false)
	now := time.Now()
	for i := range n {
		for _, x := range []*box{v1, v2} {
			x.addRow(t)
			x.checkpoint(t, spacestore.Periodic, now.Add(time.Duration(i)*time.Second))
		}
	}
	if os.Getenv("LCHAT_WAKE_FINAL") != "" {
		v2.checkpoint(t, spacestore.Final, now.Add(time.Duration(n)*time.Second))
	}
	var l1, l2 []time.Duration
	// own and s3 are the CPU time of this process and of versitygw, per format.
	var own, srv [2]time.Duration
	timed := func(k int, host string) time.Duration {
		c0, s0 := selfCPU(), s3.CPU()
		d := restoreOnce(t, cb, host)
		own[k] += selfCPU() - c0
		srv[k] += s3.CPU() - s0
		return d
	}
	const wakes = 30
	for range wakes {
		l1 = append(l1, timed(0, "v1.bench"))
		cb.reset()
		l2 = append(l2, timed(1, "v2.bench"))
	}
	t.Logf("full-file p50 %s p99 %s | page-delta p50 %s p99 %s (%d GETs) | ratio p50 %.2f",
		ms(pct(l1, .5)), ms(pct(l1, .99)), ms(pct(l2, .5)), ms(pct(l2, .99)), cb.gets.Load(), float64(pct(l2, .5))/float64(pct(l1, .5)))
	t.Logf("CPU per restore, this process + versitygw: full-file %s + %s | page-delta %s + %s",
		ms(own[0]/wakes), ms(srv[0]/wakes), ms(own[1]/wakes), ms(srv[1]/wakes))
}
