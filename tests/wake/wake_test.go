// Package wake measures wakes against the machine's floor and wake storms, and prints the
// figures (docs/wake-figures.md); it asserts only that every request is answered. The
// short forms run in CI in a few seconds; longer ones are opt-in:
//
//	LCHAT_WAKE_ROUNDS=50 go test ./tests/wake -run Figures -v
//	LCHAT_WAKE_STORM=100,1000 go test ./tests/wake -run Storm -v -timeout 30m
package wake_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/bucket/membucket"
	"github.com/lchat/lchat-caddy/engine"
	"github.com/lchat/lchat-caddy/sandbox"
	"github.com/lchat/lchat-caddy/tests/harness"
)

type dist []time.Duration

func (d dist) sorted() dist { s := slices.Clone(d); slices.Sort(s); return s }
func (d dist) q(p float64) time.Duration {
	s := d.sorted()
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, int(float64(len(s))*p))]
}
func (d dist) String() string {
	return fmt.Sprintf("p50 %6.2f ms  p99 %6.2f ms  (n=%d)", ms(d.q(0.5)), ms(d.q(0.99)), len(d))
}
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// get sends one GET on one new connection to socket and reads the whole answer.
func get(socket, path string, timeout time.Duration) (int, error) {
	c, err := net.DialTimeout("unix", socket, timeout)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: space.test\r\nConnection: close\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// execToAnswer is a start with nothing of the engine: bind a fresh socket, exec bin with
// it as fd 3 (as pid 1 of a PID namespace when pidNS, so LISTEN_PID=1 holds), send one GET
// and read the answer. It returns the time from the exec to the answer and the CPU the
// process spent in that time (it is killed at once). dataDir is $LCHAT_DATA_DIR ("": a
// fresh one).
func execToAnswer(t *testing.T, bin string, args, env []string, dataDir, path string, pidNS bool) (wall, cpu time.Duration) {
	t.Helper()
	dir, err := os.MkdirTemp("", "floor")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s.sock")
	if dataDir == "" {
		dataDir = filepath.Join(dir, "data")
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	f, err := ln.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"LISTEN_FDS=1", "LISTEN_FDNAMES=http", "LISTEN_PID=1", "LCHAT_DATA_DIR=" + dataDir, "LCHAT_HOST=floor.test"}, env...)
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if pidNS {
		ns, err := sandbox.CheckPIDNamespace()
		if err != nil {
			t.Skipf("no PID namespaces: %v", err)
		}
		ns.Apply(cmd.SysProcAttr)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	code, err := get(sock, path, 30*time.Second)
	d := time.Since(start)
	cmd.Process.Kill()
	cmd.Wait()
	if err != nil || code != 200 {
		t.Fatalf("%s: first answer %d %v", bin, code, err)
	}
	return d, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// stateDir is a short state dir the spaces' uids can traverse.
func stateDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "wk")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o711)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// newEngine is an engine over a bucket of the kind named (file: a directory, every
// write fsynced, as `lchat-caddy dev` keeps it; mem: in memory, so the figures are the
// engine's and the processes').
func newEngine(t *testing.T, bucketKind string, kinds map[string]engine.Kind, mod ...func(*engine.Config)) *engine.Engine {
	t.Helper()
	dir := stateDir(t)
	var b bucket.Bucket = membucket.New()
	if bucketKind == "file" {
		fb, err := filebucket.New(filepath.Join(dir, "bucket"))
		if err != nil {
			t.Fatal(err)
		}
		b = fb
	}
	cfg := engine.Config{Bucket: b, StateDir: filepath.Join(dir, "s"), Holder: "box", Incarnation: "1", Kinds: kinds,
		MaxStarting: envInt("LCHAT_WAKE_MAX_STARTING", 0), PageReader: harness.PageReader(t)}
	for _, m := range mod {
		m(&cfg)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		e.Drain(ctx)
		e.Close()
	})
	return e
}

// wakeToAnswer wakes host and times Acquire plus one GET of path on a new connection:
// the first answer through the box's socket. answered, when set, is called with the use
// right after a 200, before it is released.
func wakeToAnswer(e *engine.Engine, sp engine.Space, path string, answered ...func(*engine.Use)) (time.Duration, error) {
	start := time.Now()
	u, err := e.Acquire(context.Background(), sp)
	if err != nil {
		return 0, err
	}
	defer u.Release()
	code, err := get(u.Socket(), path, 60*time.Second)
	if err == nil && code != 200 {
		err = fmt.Errorf("status %d", code)
	}
	if err == nil {
		for _, f := range answered {
			f(u)
		}
	}
	return time.Since(start), err
}

func demoKind(bin string, args []string, activated bool) engine.Kind {
	return engine.Kind{Command: bin, Args: args, ReadyPath: "/healthz", SocketActivation: activated,
		Replication: engine.Replication{Class: engine.ReplicateSleep}, StopGrace: 5 * time.Second}
}

// TestWakeFigures prints, from one run with the rounds interleaved, the demo room's wake
// (asleep → first answer of GET / through the box's socket) beside the machine's floor
// (exec of a minimal Go HTTP server on a fresh socket until its first answer), the demo
// binary's own exec to first answer, and the engine's overhead (wake minus the app's own
// start). The kinds are of the default durability, bucket, whose wake starts the instance
// once its lease, fence and log seal are written; the checkpoint series beside them starts
// it while they are written. LCHAT_WAKE_ROUNDS sets the rounds (default 5),
// LCHAT_WAKE_BUCKET the bucket (file, the default, or mem).
func TestWakeFigures(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("figures are taken as CI runs: root")
	}
	rounds := envInt("LCHAT_WAKE_ROUNDS", 5)
	minimal := harness.Program(t, "lchat-test-minimal", "./tests/wake/minimal")
	demo := harness.DemoSpaceBinary(t)
	// The same binary built with cgo (dynamically linked), as `go build` makes it by
	// default: what building it without cgo saves at each exec.
	demoCgo := harness.ProgramWithCgo(t, "lchat-test-demo-space-cgo", "./cmd/lchat-demo-space")
	big := harness.Binary(t)
	bk := os.Getenv("LCHAT_WAKE_BUCKET")
	if bk == "" {
		bk = "file"
	}
	checkpoint := demoKind(demo, nil, true)
	checkpoint.Durability = engine.DurabilityCheckpoint
	e := newEngine(t, bk, map[string]engine.Kind{
		"small":      demoKind(demo, nil, true),
		"checkpoint": checkpoint,
		"cgo":        demoKind(demoCgo, nil, true),
		"alias":      demoKind(big, []string{"demo-space"}, true),
		"polling":    demoKind(demo, nil, false),
		"before":     demoKind(big, []string{"demo-space"}, false),
	})
	// The same socket-activated kind on a box whose wakes hold the lease before they
	// restore and start (as before the lease overlapped the start), for the side-by-side.
	serial := newEngine(t, bk, map[string]engine.Kind{"serial": demoKind(demo, nil, true)},
		func(c *engine.Config) { c.LeaseBeforeStart = true })
	var phases = map[string]*engine.WakePhases{}
	var phaseMu sync.Mutex
	note := func(ev engine.Event) {
		if ev.Type == engine.EventWake && ev.Err == "" {
			phaseMu.Lock()
			p := ev.Phases
			phases[ev.Host] = &p
			phaseMu.Unlock()
		}
	}
	defer e.Observe(note)()
	defer serial.Observe(note)()
	engineOf := func(k string) *engine.Engine {
		if k == "serial" {
			return serial
		}
		return e
	}
	type series struct {
		name string
		d    dist
	}
	var floor, floorNS, demoExec, demoCgoExec, overhead, overheadSerial dist
	var floorCPU, demoCPU, demoCgoCPU dist
	wakes := map[string]*dist{}
	phaseSum := map[string][]engine.WakePhases{}
	order := []string{"small", "checkpoint", "serial", "cgo", "alias", "polling", "before"}
	for _, k := range order {
		wakes[k] = &dist{}
		// The first wake of a space creates its database; the figures are of wakes of a
		// space that has state.
		if _, err := wakeToAnswer(engineOf(k), engine.Space{Host: k + ".test", Kind: k}, "/"); err != nil {
			t.Fatalf("%s: first wake: %v", k, err)
		}
		if err := engineOf(k).Sleep(context.Background(), k+".test"); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	// The demo binary alone runs on a data dir that has its database, as a wake's has.
	demoData := filepath.Join(stateDir(t), "data")
	execToAnswer(t, demo, nil, nil, demoData, "/", true)
	for range rounds {
		fw, fc := execToAnswer(t, minimal, nil, nil, "", "/", false)
		floor, floorCPU = append(floor, fw), append(floorCPU, fc)
		fw, _ = execToAnswer(t, minimal, nil, nil, "", "/", true)
		floorNS = append(floorNS, fw)
		de, dc := execToAnswer(t, demo, nil, nil, demoData, "/", true)
		demoExec, demoCPU = append(demoExec, de), append(demoCPU, dc)
		cw, cc := execToAnswer(t, demoCgo, nil, nil, demoData, "/", true)
		demoCgoExec, demoCgoCPU = append(demoCgoExec, cw), append(demoCgoCPU, cc)
		for _, k := range order {
			host := k + ".test"
			d, err := wakeToAnswer(engineOf(k), engine.Space{Host: host, Kind: k}, "/")
			if err != nil {
				t.Fatalf("%s wake: %v", k, err)
			}
			*wakes[k] = append(*wakes[k], d)
			switch k {
			case "small":
				overhead = append(overhead, d-de)
			case "serial":
				overheadSerial = append(overheadSerial, d-de)
			}
			phaseMu.Lock()
			if p := phases[host]; p != nil {
				phaseSum[k] = append(phaseSum[k], *p)
			}
			phaseMu.Unlock()
			if err := engineOf(k).Sleep(ctx, host); err != nil {
				t.Fatal(err)
			}
		}
	}
	fmt.Printf("\nwake figures, %d rounds interleaved, %s bucket (load %s)\n", rounds, bk, loadavg())
	fmt.Printf("  floor: minimal Go server, exec to first answer        %s\n", floor)
	fmt.Printf("  floor in a PID namespace (as socket activation runs)  %s\n", floorNS)
	fmt.Printf("  lchat-demo-space alone, exec to first answer (pid 1)  %s\n", demoExec)
	fmt.Printf("    the same binary built with cgo (dynamically linked)  %s\n", demoCgoExec)
	fmt.Printf("  CPU from exec to first answer, p50: floor %.2f ms, lchat-demo-space %.2f ms, with cgo %.2f ms\n",
		ms(floorCPU.q(.5)), ms(demoCPU.q(.5)), ms(demoCgoCPU.q(.5)))
	names := map[string]string{
		"small":      "demo room wake: lchat-demo-space, socket activation",
		"checkpoint": "  the same, durability checkpoint (start beside lease)",
		"serial":     "  the same, lease held before restore and start (old)",
		"cgo":        "  the same, lchat-demo-space built with cgo",
		"alias":      "demo room wake: lchat-caddy demo-space, socket act.",
		"polling":    "demo room wake: lchat-demo-space, polled readiness",
		"before":     "demo room wake: lchat-caddy demo-space, polled (old)",
	}
	for _, k := range order {
		d := *wakes[k]
		fmt.Printf("  %-52s  %s  = %.1fx the floor at p50\n", names[k], d, float64(d.q(0.5))/float64(floor.q(0.5)))
		var le, re, fe, st dist
		for _, p := range phaseSum[k] {
			le, re, fe, st = append(le, p.Lease), append(re, p.Restore), append(fe, p.Fence), append(st, p.Start)
		}
		fmt.Printf("      phases p50: restore %.2f  start %.2f  lease %.2f  fence %.2f ms (each what remained beyond the ones before it)\n", ms(re.q(.5)), ms(st.q(.5)), ms(le.q(.5)), ms(fe.q(.5)))
	}
	fmt.Printf("  engine overhead (socket-activated wake minus the demo binary's own exec to answer, per round): p50 %.2f ms; lease before start (old): p50 %.2f ms\n\n",
		ms(overhead.q(0.5)), ms(overheadSerial.q(0.5)))
}

func sum(d dist) (s time.Duration) {
	for _, v := range d {
		s += v
	}
	return s
}

func cpuTime(who int) time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(who, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// cpuTicks reads the machine's CPU time from /proc/stat's first line, in clock ticks:
// all of it, and what the hypervisor stole (the 8th field: time this VM's vCPUs were
// runnable but not run; a thread's schedstat counts that time as its own).
func cpuTicks() (total, steal int64) {
	b, _ := os.ReadFile("/proc/stat")
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		if i < 8 { // guest time is counted in user already
			total += v
		}
		if i == 7 {
			steal = v
		}
	}
	return total, steal
}

// TestWakeStorm prints what a storm of concurrent first requests to as many sleeping demo
// spaces costs on one box: every request is answered (the assertion), within what time,
// and at what rate; and how far the answers kept the order of the requests.
// LCHAT_WAKE_STORM lists the storm sizes (default 20), LCHAT_WAKE_BUCKET the buckets
// (default mem,file), LCHAT_WAKE_STORM_SPLIT=1 splits each instance's CPU at its first
// answer.
func TestWakeStorm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("figures are taken as CI runs: root")
	}
	sizes := []int{20}
	if v := os.Getenv("LCHAT_WAKE_STORM"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				t.Fatalf("LCHAT_WAKE_STORM=%q", v)
			}
			sizes = append(sizes, n)
		}
	}
	buckets := []string{"mem", "file"}
	if v := os.Getenv("LCHAT_WAKE_BUCKET"); v != "" {
		buckets = strings.Split(v, ",")
	}
	demo := harness.DemoSpaceBinary(t)
	for _, bk := range buckets {
		for _, n := range sizes {
			t.Run(bk+"/"+strconv.Itoa(n), func(t *testing.T) { storm(t, demo, bk, n) })
		}
	}
}

func storm(t *testing.T, demo, bk string, n int) {
	e := newEngine(t, bk, map[string]engine.Kind{"demo": demoKind(demo, nil, true)})
	ctx := context.Background()
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("s%04d.test", i)
	}
	// Every space has woken once (its database exists) and sleeps.
	prep := time.Now()
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, h := range hosts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := wakeToAnswer(e, engine.Space{Host: h, Kind: "demo"}, "/"); err != nil {
				t.Errorf("%s: first wake: %v", h, err)
				return
			}
			if err := e.Sleep(ctx, h); err != nil {
				t.Errorf("%s: sleep: %v", h, err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("%d spaces prepared in %v", n, time.Since(prep))
	if os.Getenv("LCHAT_WAKE_STORM_PROFILE") != "" {
		f, _ := os.Create(os.Getenv("LCHAT_WAKE_STORM_PROFILE"))
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}

	type answer struct {
		sent, done time.Duration
		err        error
		pid        int           // the instance that answered
		cpu        time.Duration // its CPU from its exec to its first answer
	}
	var phaseMu sync.Mutex
	var le, re, fe, st dist
	order := map[string]uint64{} // each storm wake's place in the engine's order of first requests
	defer e.Observe(func(ev engine.Event) {
		if ev.Type == engine.EventWake && ev.Err == "" {
			phaseMu.Lock()
			order[ev.Host] = ev.Order
			le, re, fe, st = append(le, ev.Phases.Lease), append(re, ev.Phases.Restore), append(fe, ev.Phases.Fence), append(st, ev.Phases.Start)
			phaseMu.Unlock()
		}
	})()
	// LCHAT_WAKE_STORM_SPLIT=1 reads each instance's CPU at its first answer too. The
	// reads (a /proc directory per instance) are the storm process's CPU, so they raise
	// the box's figure: about a third of it at 1,000 in a profile.
	split := os.Getenv("LCHAT_WAKE_STORM_SPLIT") != ""
	answers := make([]answer, n)
	var ready, fire sync.WaitGroup
	ready.Add(n)
	fire.Add(1)
	var t0 time.Time
	for i, h := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ready.Done()
			fire.Wait()
			sent := time.Since(t0)
			a := answer{sent: sent}
			_, a.err = wakeToAnswer(e, engine.Space{Host: h, Kind: "demo"}, "/api/messages", func(u *engine.Use) {
				a.done = time.Since(t0)
				if split {
					// The instance's CPU at its first answer, against the storm's end
					// below: an awake instance that keeps spending while the others
					// start shows there.
					a.pid, _ = strconv.Atoi(strings.SplitN(u.Instance(), "@", 2)[0])
					a.cpu = harness.ProcessCPU(a.pid)
				}
			})
			answers[i] = a
		}()
	}
	ready.Wait()
	selfBefore, kidsBefore := cpuTime(syscall.RUSAGE_SELF), cpuTime(syscall.RUSAGE_CHILDREN)
	totalBefore, stealBefore := cpuTicks()
	t0 = time.Now()
	fire.Done()
	wg.Wait()
	totalAfter, stealAfter := cpuTicks()
	selfCPU := cpuTime(syscall.RUSAGE_SELF) - selfBefore
	// The instances' CPU from their exec to now (they run on): every instance is a
	// child of this process, reaped ones counted by the kernel, running ones read from
	// each of their threads' /proc/<pid>/task/<tid>/schedstat (nanoseconds on a CPU;
	// /proc/<pid>/schedstat is the main thread's alone, and a Go program's start runs on
	// several).
	kidsCPU := cpuTime(syscall.RUSAGE_CHILDREN) - kidsBefore
	var instCPU dist
	running := map[int]time.Duration{}
	for _, st := range e.Status() {
		if st.PID > 0 {
			c := harness.ProcessCPU(st.PID)
			kidsCPU += c
			instCPU = append(instCPU, c)
			running[st.PID] = c
		}
	}
	var toAnswer, afterAnswer dist
	for _, a := range answers {
		if end, ok := running[a.pid]; ok && a.err == nil && a.cpu > 0 {
			toAnswer, afterAnswer = append(toAnswer, a.cpu), append(afterAnswer, end-a.cpu)
		}
	}
	var lat dist
	var last, lastSent time.Duration
	failed := 0
	for _, a := range answers {
		lastSent = max(lastSent, a.sent)
		if a.err != nil {
			failed++
			t.Errorf("a storm request failed: %v", a.err)
			continue
		}
		lat = append(lat, a.done-a.sent)
		last = max(last, a.done)
	}
	// Order: of the pairs whose first requests reached the engine one before the other
	// (the wake's Order), how many were answered the other way; and the same by the
	// order this process's goroutines stamped them sent (pairs at least 1 ms apart),
	// which this process's own scheduler reorders on their way to the engine.
	ticket := make([]uint64, n)
	phaseMu.Lock()
	for i, h := range hosts {
		ticket[i] = order[h]
	}
	phaseMu.Unlock()
	answeredLater := func(i, j int) bool { return answers[i].done > answers[j].done }
	inv, pairs := invertedPairs(answers, func(i, j int) bool {
		return answers[i].err == nil && answers[j].err == nil && ticket[i] < ticket[j]
	}, answeredLater)
	invSent, pairsSent := invertedPairs(answers, func(i, j int) bool { return answers[i].sent+time.Millisecond < answers[j].sent },
		answeredLater)
	fmt.Printf("\nwake storm: %d concurrent first requests (GET /api/messages) to %d sleeping demo spaces (lchat-demo-space, socket activation), one box, %s bucket, load %s\n", n, n, bk, loadavg())
	fmt.Printf("  all answered within %.0f ms of the first sent; per request %s  max %.0f ms; %.0f wakes/s; %d failed; answer order inverted for %.2f%% of the %d pairs by their first requests' order at the engine (%.1f%% of the %d pairs by the order this process's goroutines sent them, >1 ms apart)\n\n",
		ms(last), lat, ms(lat.q(1)), float64(n-failed)/last.Seconds(), failed, inv, pairs, invSent, pairsSent)
	fmt.Printf("  the requests were sent over %.1f ms; %d instances still running, CPU each %s\n", ms(lastSent), len(instCPU), instCPU)
	if split {
		fmt.Printf("  of that, from exec to the first answer %s (sum %.0f ms); from the first answer to the storm's end %s (sum %.0f ms); the box's CPU below includes these reads\n",
			toAnswer, ms(sum(toAnswer)), afterAnswer, ms(sum(afterAnswer)))
	}
	perWake := (selfCPU + kidsCPU) / time.Duration(n)
	fmt.Printf("  CPU per wake: %.1f ms (the box %.1f ms, the instance %.1f ms from its exec to the storm's end): %d CPUs bound a storm to %.0f wakes/s\n",
		ms(perWake), ms(selfCPU/time.Duration(n)), ms(kidsCPU/time.Duration(n)), runtime.NumCPU(), float64(runtime.NumCPU())/perWake.Seconds())
	fmt.Printf("  the storm had %.0f%% of this machine's %d CPUs (the rest went to other work: load %s)\n",
		100*float64(selfCPU+kidsCPU)/float64(last*time.Duration(runtime.NumCPU())), runtime.NumCPU(), loadavg())
	if d := totalAfter - totalBefore; d > 0 {
		fmt.Printf("  the hypervisor stole %.1f%% of the machine's CPU time during the storm (/proc/stat)\n", 100*float64(stealAfter-stealBefore)/float64(d))
	}
	phaseMu.Lock()
	defer phaseMu.Unlock()
	fmt.Printf("  engine phases (prep and storm wakes), p50/p99 ms: lease %.1f/%.1f  restore %.1f/%.1f  fence %.1f/%.1f  start %.1f/%.1f\n\n",
		ms(le.q(.5)), ms(le.q(.99)), ms(re.q(.5)), ms(re.q(.99)), ms(fe.q(.5)), ms(fe.q(.99)), ms(st.q(.5)), ms(st.q(.99)))
}

// invertedPairs is the share (percent) of the ordered pairs of n items (first(i, j)) that
// inverted(i, j) holds for, and how many pairs there were.
func invertedPairs[T any](items []T, first, inverted func(i, j int) bool) (float64, int) {
	var pairs, inv int
	for i := range items {
		for j := range items {
			if i != j && first(i, j) {
				pairs++
				if inverted(i, j) {
					inv++
				}
			}
		}
	}
	if pairs == 0 {
		return 0, 0
	}
	return 100 * float64(inv) / float64(pairs), pairs
}
