package sandbox

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary doubles as the instance: SANDBOX_TEST_MODE picks what it does.
func TestMain(m *testing.M) {
	switch os.Getenv("SANDBOX_TEST_MODE") {
	case "":
		os.Exit(m.Run())
	case "escape":
		// Double fork into a new session: the grandchild is outside the instance's
		// process group and session, and its parent is gone.
		c := exec.Command(os.Args[0])
		c.Env = append(os.Environ(), "SANDBOX_TEST_MODE=mid")
		c.Stdout = os.Stdout
		c.Run()
		time.Sleep(time.Hour)
	case "mid":
		c := exec.Command(os.Args[0])
		c.Env = append(os.Environ(), "SANDBOX_TEST_MODE=leaf")
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		c.Stdout = os.Stdout
		c.Start()
		fmt.Println(c.Process.Pid)
		os.Exit(0)
	case "leaf":
		syscall.Close(1)
		time.Sleep(time.Hour)
	case "hog":
		var keep [][]byte
		for {
			b := make([]byte, 8<<20)
			for i := range b {
				b[i] = 1
			}
			keep = append(keep, b)
		}
	case "caps":
		st, _ := os.ReadFile("/proc/self/status")
		os.Stdout.Write(st)
	case "ambient-box":
		ambientBox()
	case "netprobe":
		netProbe(strings.Fields(os.Getenv("SANDBOX_PROBE")))
	case "mainthread":
		mainThreadProbe()
	}
}

func rootCgroups(t *testing.T) *Cgroups {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
	c, err := OpenCgroups()
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	t.Cleanup(c.Close)
	t.Log(c.Describe())
	return c
}

func TestGroupKillEndsEscapedDescendants(t *testing.T) {
	c := rootCgroups(t)
	t.Run("as opened", func(t *testing.T) { testEscape(t, c) })
	if c.v2 != "" && c.v1[ctrlFreezer] != "" {
		// The same host without its v2 tree: the v1 freezer ends the group.
		v1 := &Cgroups{name: c.name + "-v1", v2ctrl: map[string]bool{}, v1: c.v1}
		for _, d := range v1.parents() {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		defer v1.Close()
		t.Run("v1 freezer", func(t *testing.T) { testEscape(t, v1) })
	}
}

func testEscape(t *testing.T, c *Cgroups) {
	g, err := c.Create("escape.test", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "SANDBOX_TEST_MODE=escape")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, _ := cmd.StdoutPipe()
	release, err := g.Start(cmd, StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := strconv.Atoi(strings.TrimSpace(line))
	if sid, _ := unix.Getsid(leaf); sid != leaf {
		t.Fatalf("grandchild %d is not in its own session (sid %d)", leaf, sid)
	}
	// The stop the engine used before cgroups: the process group. The grandchild
	// survives it.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	cmd.Wait()
	if !processAlive(leaf) || zombie(leaf) {
		t.Fatalf("grandchild %d died with its process group: the test proves nothing", leaf)
	}
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for processAlive(leaf) && !zombie(leaf) {
		if time.Now().After(deadline) {
			t.Fatalf("grandchild %d survived the group kill", leaf)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
}

func TestGroupMemoryLimitOOMKills(t *testing.T) {
	c := rootCgroups(t)
	if err := c.Check(Limits{MemoryBytes: 1}); err != nil {
		t.Skip(err)
	}
	g, err := c.Create("hog.test", Limits{MemoryBytes: 64 << 20, Pids: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "SANDBOX_TEST_MODE=hog")
	release, err := g.Start(cmd, StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
		if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("hog ended with %v, want killed by SIGKILL", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("hog still running under a 64 MiB limit")
	}
	if n := g.OOMKills(); n < 1 {
		t.Fatalf("OOMKills = %d after the hog was killed", n)
	}
}

func TestCheckRefusesWhatTheHostCannotEnforce(t *testing.T) {
	c := &Cgroups{v2: "/sys/fs/cgroup/unified/x", v2ctrl: map[string]bool{}, v1: map[string]string{ctrlPids: "/p"}}
	if err := c.Check(Limits{Pids: 10}); err != nil {
		t.Fatalf("pids via v1 refused: %v", err)
	}
	err := c.Check(Limits{MemoryBytes: 1 << 20, CPU: 0.5, Pids: 10})
	if err == nil || !strings.Contains(err.Error(), "cpu and memory limit") {
		t.Fatalf("err = %v, want the cpu and memory limits refused by name", err)
	}
}

func TestStartDropsAmbientCapabilities(t *testing.T) {
	c := rootCgroups(t)
	g, err := c.Create("caps.test", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	// The binary must be reachable by the unprivileged uid.
	dir, err := os.MkdirTemp("", "caps")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o711)
	bin, _ := os.ReadFile(os.Args[0])
	os.WriteFile(dir+"/inst", bin, 0o755)
	cmd := exec.Command(dir + "/inst")
	cmd.Env = append(os.Environ(), "SANDBOX_TEST_MODE=caps")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 3999999, Gid: 3999999}}
	var out strings.Builder
	cmd.Stdout = &out
	release, err := g.Start(cmd, StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	cmd.Wait()
	for _, f := range []string{"CapInh:", "CapPrm:", "CapEff:", "CapAmb:"} {
		if !strings.Contains(out.String(), f+"\t0000000000000000") {
			t.Errorf("instance has %s capabilities:\n%s", f, out.String())
		}
	}
}

func TestMountinfoParsing(t *testing.T) {
	f := t.TempDir() + "/mi"
	os.WriteFile(f, []byte(`30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
32 25 0:28 /kube /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
`), 0o600)
	ms, err := readMounts(f)
	if err != nil || len(ms) != 3 {
		t.Fatalf("%v %v", ms, err)
	}
	if ms[0].fstype != "cgroup" || ms[0].opts[1] != "memory" || ms[1].fstype != "cgroup2" {
		t.Fatalf("%+v", ms)
	}
	if got := join(ms[2], "/kube/pod1"); got != "/sys/fs/cgroup/pids/pod1" {
		t.Fatalf("join = %s", got)
	}
}

// TestNonRootBoxWithAmbientCapsStartsInstanceWithout runs the production shape: a box
// that is not root and holds its capabilities as ambient ones (systemd's
// AmbientCapabilities). A uid switch between two non-zero uids keeps capabilities, so
// only Group.Start's drop keeps them from the instance.
func TestNonRootBoxWithAmbientCapsStartsInstanceWithout(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to set up the non-root box")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv")
	}
	dir, err := os.MkdirTemp("", "ambient")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o711)
	bin, _ := os.ReadFile(os.Args[0])
	os.WriteFile(dir+"/box", bin, 0o755)
	caps := "+setuid,+setgid,+chown,+dac_override,+fowner,+kill"
	cmd := exec.Command(setpriv, "--reuid=3999990", "--regid=3999990", "--clear-groups",
		"--inh-caps="+caps, "--ambient-caps="+caps, dir+"/box")
	cmd.Env = append(os.Environ(), "SANDBOX_TEST_MODE=ambient-box")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	s := string(out)
	if !strings.Contains(s, "box CapAmb:\t00000000000000eb") {
		t.Fatalf("the box did not hold the ambient capabilities the test meant to give it:\n%s", s)
	}
	for _, f := range []string{"CapInh:", "CapPrm:", "CapEff:", "CapAmb:"} {
		if !strings.Contains(s, "\n"+f+"\t0000000000000000") {
			t.Errorf("instance has %s capabilities:\n%s", f, s)
		}
	}
	if !strings.Contains(s, "Uid:\t3999991") {
		t.Errorf("instance did not run as uid 3999991:\n%s", s)
	}
}

// ambientBox is the non-root box of the test above: it starts the caps mode as another
// uid through a Group of no hierarchy (the capability drop does not depend on one).
func ambientBox() {
	st, _ := os.ReadFile("/proc/self/status")
	for line := range strings.SplitSeq(string(st), "\n") {
		if strings.HasPrefix(line, "CapAmb:") {
			fmt.Println("box " + line)
		}
	}
	g := &Group{c: &Cgroups{v2ctrl: map[string]bool{}, v1: map[string]string{}}}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "SANDBOX_TEST_MODE=caps")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 3999991, Gid: 3999991, Groups: []uint32{}}}
	cmd.Stdout = os.Stdout
	release, err := g.Start(cmd, StartOptions{})
	if err != nil {
		fmt.Println("start:", err)
		os.Exit(1)
	}
	cmd.Wait()
	release()
}

func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // gone
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

func TestFreezeStopsEveryProcessUntilThaw(t *testing.T) {
	c := rootCgroups(t)
	g, err := c.Create("freeze.test", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
	release, err := g.Start(cmd, StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { g.Kill(); cmd.Wait(); release() }()
	if err := g.Freeze(); err != nil {
		t.Fatal(err)
	}
	ticks := func() string {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/stat")
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		return f[11] // utime
	}
	before := ticks()
	time.Sleep(300 * time.Millisecond)
	if after := ticks(); after != before {
		t.Fatalf("a frozen busy loop used CPU: utime %s -> %s", before, after)
	}
	if err := g.Thaw(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if after := ticks(); after == before {
		t.Fatal("the busy loop did not run again after Thaw")
	}
}

// TestWaitEventsWakesOnTheChange: the wait on a cgroup.events line returns when the file
// changes to hold it (an inotify modify event, as the kernel sends for cgroup.events), and
// says what it waited for when it never does.
func TestWaitEventsWakesOnTheChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cgroup.events")
	if err := os.WriteFile(path, []byte("populated 1\nfrozen 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- waitEvents(path, "populated 0", time.Minute) }()
	select {
	case err := <-done:
		t.Fatalf("returned before the change: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := os.WriteFile(path, []byte("populated 0\nfrozen 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("after the change: %v", err)
	}
	if err := waitEvents(path, "frozen 1", 20*time.Millisecond); err == nil || !strings.Contains(err.Error(), `"frozen 1"`) {
		t.Fatalf("a line that never comes: %v", err)
	}
}
