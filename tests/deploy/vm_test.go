package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// phases records how long each step of the VM test took, printed as it goes and again
// at the end: TCG makes every step slow, and the numbers are what docs/deploy-test.md
// quotes.
type phases struct {
	t     *testing.T
	start time.Time
	cur   string
	at    time.Time
	done  []string
}

func newPhases(t *testing.T) *phases {
	p := &phases{t: t, start: time.Now()}
	t.Cleanup(func() {
		p.end()
		t.Logf("phase timings:\n  %s\n  total %s", strings.Join(p.done, "\n  "), time.Since(p.start).Round(time.Second))
	})
	return p
}

// begin ends the current phase and starts the named one.
func (p *phases) begin(name string) {
	p.end()
	p.cur, p.at = name, time.Now()
	p.t.Logf("=== phase %s (%s since start)", name, time.Since(p.start).Round(time.Second))
}

func (p *phases) end() {
	if p.cur == "" {
		return
	}
	d := time.Since(p.at).Round(100 * time.Millisecond)
	p.done = append(p.done, fmt.Sprintf("%-28s %s", p.cur, d))
	p.t.Logf("    phase %s took %s", p.cur, d)
	p.cur = ""
}

// cacheDir is where built images live between runs: $LCHAT_DEPLOY_CACHE, else
// /var/cache/lchat-deploy-test as root, else $XDG_CACHE_HOME/lchat-deploy-test. Never in
// the checkout.
func cacheDir(t *testing.T) string {
	if d := os.Getenv("LCHAT_DEPLOY_CACHE"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/cache/lchat-deploy-test"
	}
	d, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(d, "lchat-deploy-test")
}

// needTools installs the Debian packages the VM test runs (as root, through apt-get,
// as scripts/test installs chromium), or skips without root.
func needTools(t *testing.T) {
	var missing []string
	for bin, pkg := range map[string]string{"mmdebstrap": "mmdebstrap", "qemu-system-x86_64": "qemu-system-x86", "mke2fs": "e2fsprogs"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, pkg)
		}
	}
	if len(missing) == 0 {
		return
	}
	if os.Geteuid() != 0 {
		t.Skipf("the VM test needs %v (apt-get install as root)", missing)
	}
	for _, args := range [][]string{{"update", "-qq"}, append([]string{"install", "-y", "-qq", "--no-install-recommends"}, missing...)} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("apt-get %v: %v\n%s", args, err, out)
		}
	}
}

// image returns the directory with disk.img, vmlinuz and initrd.img, building it with
// mkimage.sh when no image of this mkimage.sh is cached.
func image(t *testing.T) string {
	script := filepath.Join(harness.RepoRoot(), "tests", "deploy", "mkimage.sh")
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	dir := filepath.Join(cacheDir(t), "img-"+hex.EncodeToString(sum[:])[:16])
	if _, err := os.Stat(filepath.Join(dir, "disk.img")); err == nil {
		t.Logf("image cached in %s", dir)
		return dir
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("building the Debian 12 image into %s (mmdebstrap, about 90 s)", dir)
	cmd := exec.Command(script, dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mkimage.sh: %v\n%s", err, out)
	}
	return dir
}

// goBuild builds pkg of the main module into out.
func goBuild(t *testing.T, out, pkg string, env ...string) {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = harness.RepoRoot()
	cmd.Env = append(os.Environ(), env...)
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", pkg, err, o)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// vm is one running QEMU guest and the agent inside it.
type vm struct {
	t       *testing.T
	dir     string
	agent   string // http://127.0.0.1:<port>
	token   string
	cmd     *exec.Cmd
	exited  chan struct{}
	console string
}

// bootVM copies the cached disk (the guest writes to its copy), makes the payload disk
// from payloadDir and starts QEMU. Its only network is QEMU's user network with
// restrict=on: the guest reaches nothing outside, and the host reaches the agent through
// one forward bound to 127.0.0.1.
func bootVM(t *testing.T, img, payloadDir, token string) *vm {
	return bootVMSized(t, img, payloadDir, token, 2048, 2)
}

// bootVMSized is bootVM with memMiB of memory and cpus virtual CPUs.
func bootVMSized(t *testing.T, img, payloadDir, token string, memMiB, cpus int) *vm {
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.img")
	if out, err := exec.Command("cp", "--sparse=always", filepath.Join(img, "disk.img"), disk).CombinedOutput(); err != nil {
		t.Fatalf("copying the disk: %v\n%s", err, out)
	}
	payload := filepath.Join(dir, "payload.img")
	f, err := os.Create(payload)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(1 << 30) // sparse; mke2fs fills what the files need
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mke2fs", "-q", "-t", "ext4", "-d", payloadDir, payload).CombinedOutput(); err != nil {
		t.Fatalf("making the payload disk: %v\n%s", err, out)
	}
	port := freePort(t)
	v := &vm{t: t, dir: dir, agent: fmt.Sprintf("http://127.0.0.1:%d", port), token: token,
		exited: make(chan struct{}), console: filepath.Join(dir, "console.log")}
	args := []string{
		"-accel", "tcg", "-cpu", "max", "-m", strconv.Itoa(memMiB), "-smp", strconv.Itoa(cpus),
		"-display", "none", "-monitor", "none", "-serial", "file:" + v.console,
		"-kernel", filepath.Join(img, "vmlinuz"), "-initrd", filepath.Join(img, "initrd.img"),
		"-append", "root=/dev/vda rw console=ttyS0 quiet",
		"-drive", "file=" + disk + ",format=raw,if=virtio",
		"-drive", "file=" + payload + ",format=raw,if=virtio,readonly=on",
		"-nic", fmt.Sprintf("user,model=virtio-net-pci,restrict=on,hostfwd=tcp:127.0.0.1:%d-:8022", port),
	}
	v.cmd = exec.Command("qemu-system-x86_64", args...)
	qlog, err := os.Create(filepath.Join(dir, "qemu.log"))
	if err != nil {
		t.Fatal(err)
	}
	v.cmd.Stdout, v.cmd.Stderr = qlog, qlog
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := v.cmd.Start(); err != nil {
		t.Fatalf("starting qemu: %v", err)
	}
	go func() { v.cmd.Wait(); qlog.Close(); close(v.exited) }()
	t.Cleanup(func() {
		if d, _ := time.ParseDuration(os.Getenv("LCHAT_DEPLOY_HOLD")); d > 0 && t.Failed() {
			t.Logf("holding the failed VM for %s: agent %s, token in %s", d, v.agent, filepath.Join(payloadDir, "token"))
			select {
			case <-v.exited:
			case <-time.After(d):
			}
		}
		select {
		case <-v.exited:
		default:
			syscall.Kill(-v.cmd.Process.Pid, syscall.SIGKILL)
			<-v.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(v.console)
			lines := strings.Split(string(b), "\n")
			if len(lines) > 60 {
				lines = lines[len(lines)-60:]
			}
			t.Logf("guest console tail:\n%s", strings.Join(lines, "\n"))
			q, _ := os.ReadFile(filepath.Join(dir, "qemu.log"))
			if len(q) > 0 {
				t.Logf("qemu output:\n%s", q)
			}
		}
	})
	return v
}

// bootID answers the guest's boot id, or "" while the agent does not answer.
func (v *vm) bootID() string {
	req, _ := http.NewRequest("GET", v.agent+"/boot", nil)
	req.Header.Set("X-Token", v.token)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return string(b)
}

// waitBoot waits until the agent answers with a boot id other than prev.
func (v *vm) waitBoot(prev string, timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	for {
		if id := v.bootID(); id != "" && id != prev {
			return id
		}
		select {
		case <-v.exited:
			v.t.Fatal("qemu exited")
		default:
		}
		if time.Now().After(deadline) {
			v.t.Fatalf("the guest's agent did not answer within %s", timeout)
		}
		time.Sleep(time.Second)
	}
}

// try runs script in the guest as root and answers its combined output and exit code.
func (v *vm) try(timeout time.Duration, script string) (string, int) {
	v.t.Helper()
	body, _ := json.Marshal(map[string]any{"script": script, "timeout_s": int(timeout.Seconds())})
	ctx, cancel := context.WithTimeout(context.Background(), timeout+30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", v.agent+"/exec", bytes.NewReader(body))
	req.Header.Set("X-Token", v.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		v.t.Fatalf("agent: %v", err)
	}
	defer resp.Body.Close()
	var res struct {
		Out  string `json:"out"`
		Code int    `json:"code"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		v.t.Fatalf("agent answer: %v", err)
	}
	return res.Out, res.Code
}

// run is try that fails the test on a non-zero exit.
func (v *vm) run(timeout time.Duration, script string) string {
	v.t.Helper()
	out, code := v.try(timeout, script)
	if code != 0 {
		v.t.Fatalf("guest script exited %d:\n%s\n--- output:\n%s", code, script, out)
	}
	return out
}

// waitFor runs script every 2 s until it exits 0, and answers its output.
func (v *vm) waitFor(what string, timeout time.Duration, script string) string {
	v.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, code := v.try(time.Minute, script)
		if code == 0 {
			return out
		}
		if time.Now().After(deadline) {
			v.t.Fatalf("%s: not within %s; last output:\n%s", what, timeout, out)
		}
		time.Sleep(2 * time.Second)
	}
}
