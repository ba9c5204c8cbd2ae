package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/internal/testwait"
)

// BoxOptions configures StartBox. Give Caddyfile or JSON. In either, the tokens
// {$LCHAT_TEST_ADMIN}, {$LCHAT_TEST_HTTP} and {$LCHAT_TEST_DIR} stand for the box's
// admin address, HTTP address (ip:port) and its private directory; they are also in
// the process environment, so a Caddyfile can use them as ordinary env placeholders.
type BoxOptions struct {
	Caddyfile string
	JSON      string
	// Env is extra environment (NAME=VALUE), e.g. S3.Env(prefix).
	Env []string
	// IP is the loopback address of the box's HTTP address ({$LCHAT_TEST_HTTP});
	// default 127.0.0.1. Mesh tests use 127.0.0.x to give each box its own address.
	IP string
	// AdminIP is the address of the admin API ({$LCHAT_TEST_ADMIN}); default
	// 127.0.0.1 whatever IP is, as on a real box. Caddy's admin API on a loopback
	// address accepts only the Host names localhost, 127.0.0.1 and ::1 (with its port),
	// and the CLI sends the listen address as Host, so an admin API on 127.0.0.2
	// refuses every request ("host not allowed") unless the config lists that address
	// in the admin "origins".
	AdminIP string
	// Dir is the box's directory (data, config, HOME, state). Default: a new short
	// temporary directory (Unix socket paths under it must stay short).
	Dir string
	// ReadyTimeout bounds the wait for the admin API. Default 60s.
	ReadyTimeout time.Duration
}

// Box is a running lchat-caddy process.
type Box struct {
	// Dir is the box's private directory; it survives a restart of the same Box.
	Dir string
	// AdminAddr is host:port of the admin API; AdminURL is its base URL.
	AdminAddr, AdminURL string
	// HTTPAddr is ip:port of the HTTP server; HTTPURL its base URL.
	HTTPAddr, HTTPURL string

	t    testing.TB
	bin  string
	opts BoxOptions
	env  []string
	logs *SyncBuffer

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartBox starts lchat-caddy with the given config, its own admin port, HTTP port,
// HOME and XDG directories, waits until its admin API answers, and kills it when the
// test ends (printing its log tail if the test failed).
func StartBox(t testing.TB, opts BoxOptions) *Box {
	t.Helper()
	if (opts.Caddyfile == "") == (opts.JSON == "") {
		t.Fatal("StartBox: give exactly one of Caddyfile or JSON")
	}
	if opts.IP == "" {
		opts.IP = "127.0.0.1"
	}
	if opts.AdminIP == "" {
		opts.AdminIP = "127.0.0.1"
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	if opts.Dir == "" {
		d, err := os.MkdirTemp("", "box")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		opts.Dir = d
	}
	b := &Box{Dir: opts.Dir, t: t, bin: Binary(t), opts: opts, logs: new(SyncBuffer)}
	b.AdminAddr = net.JoinHostPort(opts.AdminIP, FreePort(t, opts.AdminIP))
	b.HTTPAddr = net.JoinHostPort(opts.IP, FreePort(t, opts.IP))
	b.AdminURL = "http://" + b.AdminAddr
	b.HTTPURL = "http://" + b.HTTPAddr
	for _, sub := range []string{"home", "data", "config"} {
		if err := os.MkdirAll(filepath.Join(b.Dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	b.env = b.environ()
	t.Cleanup(func() {
		b.Kill()
		b.checkNoSecretLogged()
		if t.Failed() {
			t.Logf("lchat-caddy %s log tail:\n%s", b.HTTPAddr, lastLines(b.Logs(), 80))
		}
		b.keepLogs()
	})
	b.Start()
	return b
}

// keepLogs writes the box's whole log to $LCHAT_TEST_LOGDIR (when set), named after the
// test and the box's address, for a failure whose cause lies before the printed tail.
func (b *Box) keepLogs() {
	dir := os.Getenv("LCHAT_TEST_LOGDIR")
	if dir == "" {
		return
	}
	name := strings.NewReplacer("/", "_", ":", "_").Replace(b.t.Name() + "-" + b.HTTPAddr)
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, name+".log"), []byte(b.Logs()), 0o644)
	}
	if err != nil {
		b.t.Logf("keeping the log of %s: %v", b.HTTPAddr, err)
	}
}

// checkNoSecretLogged fails the test when the box's log holds the value of a secret
// variable it was started with (a name with SECRET, TOKEN or PASSWORD in it): whatever
// a test did, tokens and keys never reach the log. Short values are skipped, as they
// may occur by chance; the failure names the variable, never the value.
func (b *Box) checkNoSecretLogged() {
	logs := b.Logs()
	for _, kv := range b.opts.Env {
		name, val, _ := strings.Cut(kv, "=")
		up := strings.ToUpper(name)
		if len(val) < 8 || !strings.Contains(up, "SECRET") && !strings.Contains(up, "TOKEN") && !strings.Contains(up, "PASSWORD") {
			continue
		}
		if strings.Contains(logs, val) {
			b.t.Errorf("lchat-caddy %s logged the value of %s", b.HTTPAddr, name)
		}
	}
}

func (b *Box) environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "HOME", strings.HasPrefix(name, "XDG_"), strings.HasPrefix(name, "LCHAT_"), strings.HasPrefix(name, "AWS_"):
			continue
		}
		env = append(env, kv)
	}
	env = append(env,
		"HOME="+filepath.Join(b.Dir, "home"),
		"XDG_DATA_HOME="+filepath.Join(b.Dir, "data"),
		"XDG_CONFIG_HOME="+filepath.Join(b.Dir, "config"),
		"LCHAT_TEST_ADMIN="+b.AdminAddr,
		"LCHAT_TEST_HTTP="+b.HTTPAddr,
		"LCHAT_TEST_DIR="+b.Dir,
	)
	return append(env, b.opts.Env...)
}

// writeConfig writes the config text and returns its path and adapter.
func (b *Box) writeConfig(caddyfile, jsonText string) (string, string) {
	b.t.Helper()
	if caddyfile != "" {
		p := filepath.Join(b.Dir, "Caddyfile")
		if err := os.WriteFile(p, []byte(caddyfile), 0o600); err != nil {
			b.t.Fatal(err)
		}
		return p, "caddyfile"
	}
	r := strings.NewReplacer("{$LCHAT_TEST_ADMIN}", b.AdminAddr, "{$LCHAT_TEST_HTTP}", b.HTTPAddr, "{$LCHAT_TEST_DIR}", b.Dir)
	p := filepath.Join(b.Dir, "config.json")
	if err := os.WriteFile(p, []byte(r.Replace(jsonText)), 0o600); err != nil {
		b.t.Fatal(err)
	}
	return p, ""
}

// Start (re)starts the process with the box's current config; StartBox calls it. A
// restarted box keeps its directory, ports and data.
func (b *Box) Start() {
	b.t.Helper()
	b.mu.Lock()
	if b.cmd != nil && b.done != nil {
		select {
		case <-b.done:
		default:
			b.mu.Unlock()
			b.t.Fatal("Box.Start: already running")
		}
	}
	path, adapter := b.writeConfig(b.opts.Caddyfile, b.opts.JSON)
	args := []string{"run", "--config", path}
	if adapter != "" {
		args = append(args, "--adapter", adapter)
	}
	cmd := exec.Command(b.bin, args...)
	cmd.Dir = b.Dir
	cmd.Env = b.env
	fmt.Fprintf(b.logs, "=== start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd.Stdout, cmd.Stderr = b.logs, b.logs
	if err := cmd.Start(); err != nil {
		b.mu.Unlock()
		b.t.Fatalf("starting lchat-caddy: %v", err)
	}
	done := make(chan struct{})
	b.cmd, b.done = cmd, done
	b.mu.Unlock()
	go func() {
		err := cmd.Wait()
		b.mu.Lock()
		b.err = err
		b.mu.Unlock()
		close(done)
	}()

	deadline := time.Now().Add(b.opts.ReadyTimeout)
	for {
		resp, err := http.Get(b.AdminURL + "/config/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-done:
			b.t.Fatalf("lchat-caddy exited during start-up (%v):\n%s", b.exitErr(), lastLines(b.Logs(), 60))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("lchat-caddy admin API not up after %v:\n%s", b.opts.ReadyTimeout, lastLines(b.Logs(), 60))
		}
	}
}

func (b *Box) exitErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// PID is the process id of the running lchat-caddy.
func (b *Box) PID() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cmd.Process.Pid
}

// Pause freezes the box with SIGSTOP and returns once every one of its threads has
// stopped. kill(2) returns before that: the kernel wakes one thread to begin the group
// stop, and the others run on (and may answer a request) until it has been scheduled,
// which on a loaded machine takes milliseconds. A box that exits meanwhile ends the wait.
func (b *Box) Pause() {
	pid := b.PID()
	syscall.Kill(pid, syscall.SIGSTOP)
	if !testwait.Poll(10*time.Second, func() bool { return b.Exited() || allThreadsStopped(pid) }) {
		// Errorf, not Fatalf (WaitFor): the fault campaign pauses boxes from its own
		// goroutines.
		b.t.Errorf("lchat-caddy %d: not every thread stopped within 10 s of SIGSTOP", pid)
	}
}

// Resume continues a paused box (SIGCONT).
func (b *Box) Resume() { syscall.Kill(b.PID(), syscall.SIGCONT) }

// allThreadsStopped reports whether every thread of pid is in the stopped state ("T" in
// /proc/<pid>/task/<tid>/stat; "t" is a tracing stop).
func allThreadsStopped(pid int) bool {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, p := range tasks {
		data, err := os.ReadFile(p)
		if err != nil {
			return false
		}
		// The state follows the command's closing parenthesis: "pid (comm) S ...".
		i := bytes.LastIndexByte(data, ')')
		if i < 0 || i+2 >= len(data) || (data[i+2] != 'T' && data[i+2] != 't') {
			return false
		}
	}
	return true
}

// Stop sends SIGTERM (a drain) and waits for the process to exit.
func (b *Box) Stop() error {
	b.t.Helper()
	return b.signalAndWait(syscall.SIGTERM, 2*time.Minute)
}

// Kill sends SIGKILL (a hard loss) and waits for the process to exit.
func (b *Box) Kill() {
	b.signalAndWait(syscall.SIGKILL, 30*time.Second)
}

func (b *Box) signalAndWait(sig syscall.Signal, timeout time.Duration) error {
	b.mu.Lock()
	cmd, done := b.cmd, b.done
	b.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return b.exitErr()
	default:
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
		return b.exitErr()
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("lchat-caddy did not exit within %v of %v", timeout, sig)
	}
}

// Exited reports whether the process has exited.
func (b *Box) Exited() bool {
	b.mu.Lock()
	done := b.done
	b.mu.Unlock()
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Reload replaces the box's config with a Caddyfile (or JSON when json is true)
// through the real `lchat-caddy reload` command.
func (b *Box) Reload(config string, isJSON bool) error {
	b.t.Helper()
	if isJSON {
		b.opts.Caddyfile, b.opts.JSON = "", config
	} else {
		b.opts.Caddyfile, b.opts.JSON = config, ""
	}
	path, adapter := b.writeConfig(b.opts.Caddyfile, b.opts.JSON)
	args := []string{"reload", "--config", path, "--address", b.AdminAddr}
	if adapter != "" {
		args = append(args, "--adapter", adapter)
	}
	out, err := b.run(args...)
	WaitOldAdminClosed(b.t, b.AdminAddr, 15*time.Second)
	if err != nil {
		return fmt.Errorf("lchat-caddy reload: %v\n%s", err, out)
	}
	return nil
}

// CLI runs an lchat-caddy subcommand against this box (with --address appended)
// and returns its combined output.
func (b *Box) CLI(args ...string) (string, error) {
	return b.run(append(args, "--address", b.AdminAddr)...)
}

func (b *Box) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.bin, args...)
	cmd.Dir = b.Dir
	cmd.Env = b.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Logs returns everything the process wrote so far (across restarts).
func (b *Box) Logs() string { return b.logs.String() }

// Admin sends a request to the admin API and returns status and body.
func (b *Box) Admin(method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	case []byte:
		rd = bytes.NewReader(v)
	default:
		data, err := json.Marshal(v)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, b.AdminURL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// AdminJSON is Admin that fails the test unless the status is want, decoding the
// answer into out (when non-nil).
func (b *Box) AdminJSON(method, path string, body any, want int, out any) {
	b.t.Helper()
	status, data, err := b.Admin(method, path, body)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	if status != want {
		b.t.Fatalf("%s %s: status %d, want %d: %s", method, path, status, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			b.t.Fatalf("%s %s: decoding %s: %v", method, path, data, err)
		}
	}
}

// Client returns an HTTP client that sends every request to this box's HTTP
// address whatever the URL's host, so tests can use real space hostnames.
func (b *Box) Client() *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second}
	return &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, b.HTTPAddr)
			},
			MaxIdleConnsPerHost: 200,
		},
		Timeout: 2 * time.Minute,
	}
}

// URL is the URL of path on host through this box, for use with Client.
func (b *Box) URL(host, path string) string {
	_, port, _ := net.SplitHostPort(b.HTTPAddr)
	return "http://" + host + ":" + port + path
}

// GrepLines is the lines of s that contain sub, for a failure's message.
func GrepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// SyncBuffer is a bytes.Buffer safe for a process's two output pipes and its readers.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
