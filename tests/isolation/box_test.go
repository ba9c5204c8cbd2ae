package isolation

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/internal/testnet"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// box is one lchat-caddy process as production runs it: the admin API on a Unix socket
// (0600), the state dir, registry and certificate storage under one directory.
type box struct {
	t        testing.TB
	dir      string // 0711, like /var/lib/lchat-caddy under the shipped unit
	admin    string // the admin socket
	adminTCP string // the admin API's TCP address instead, when set (boxOptions)
	httpAddr string
	cmd      *exec.Cmd
	done     chan struct{}
	logs     *harness.SyncBuffer
	// dial connects to the box's TCP addresses: from its network namespace, if it has one.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// boxOptions are what a box of the network tests changes.
type boxOptions struct {
	// ns runs the box in that network namespace; nil: the machine's own.
	ns *testnet.NS
	// adminTCP puts the admin API on this TCP address (as dev does, localhost:2019)
	// instead of the 0600 Unix socket.
	adminTCP string
	// dir, when set, is the directory of a box that ran before (a restart); "": a new one.
	dir string
}

// startBox runs lchat-caddy with caddyfile; {$DIR}, {$HTTP_PORT}, {$HTTPS_PORT} and the
// variables in env are in its environment.
func startBox(t *testing.T, caddyfile string, env ...string) *box {
	t.Helper()
	return startBoxWith(t, boxOptions{}, caddyfile, env...)
}

// startBoxWith is startBox with opts.
func startBoxWith(t *testing.T, opts boxOptions, caddyfile string, env ...string) *box {
	t.Helper()
	dir := opts.dir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp(outsideTmp(t), "iso"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	for _, d := range []string{dir, filepath.Join(dir, "state")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			t.Fatal(err)
		}
		os.Chmod(d, 0o711)
	}
	for _, d := range []string{"home", "data", "config"} {
		os.MkdirAll(filepath.Join(dir, d), 0o700)
	}
	b := &box{t: t, dir: dir, admin: filepath.Join(dir, "admin.sock"), adminTCP: opts.adminTCP, done: make(chan struct{}),
		logs: new(harness.SyncBuffer), dial: (&net.Dialer{}).DialContext}
	adminListen := "unix/" + b.admin + "|0600"
	if opts.adminTCP != "" {
		adminListen = opts.adminTCP
	}
	start := func(cmd *exec.Cmd) error { return cmd.Start() }
	if opts.ns != nil {
		b.dial, start = opts.ns.DialContext, opts.ns.Start
	}
	httpPort, httpsPort := harness.FreePort(t, "127.0.0.1"), harness.FreePort(t, "127.0.0.1")
	b.httpAddr = "127.0.0.1:" + httpPort
	if err := os.WriteFile(filepath.Join(dir, "Caddyfile"), []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(harness.Binary(t), "run", "--config", filepath.Join(dir, "Caddyfile"), "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(dir, "home"), "XDG_DATA_HOME="+filepath.Join(dir, "data"),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "DIR="+dir, "HTTP_PORT="+httpPort, "HTTPS_PORT="+httpsPort,
		"LCHAT_ADMIN_LISTEN="+adminListen)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = b.logs, b.logs
	if err := start(cmd); err != nil {
		t.Fatal(err)
	}
	b.cmd = cmd
	go func() { cmd.Wait(); close(b.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-b.done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-b.done
		}
		if t.Failed() {
			t.Logf("lchat-caddy log:\n%s", b.logs.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if st, _, err := b.adminCall("GET", "/config/", nil); err == nil && st == 200 {
			return b
		}
		select {
		case <-b.done:
			t.Fatalf("lchat-caddy exited during start-up:\n%s", b.logs.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin socket not answering:\n%s", b.logs.String())
		}
	}
}

func (b *box) adminCall(method, path string, body any) (int, []byte, error) {
	base := "http://admin"
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", b.admin)
	}
	if b.adminTCP != "" {
		// On TCP, Caddy's admin API accepts only its own address as the Host.
		base = "http://" + b.adminTCP
		dial = func(ctx context.Context, _, _ string) (net.Conn, error) { return b.dial(ctx, "tcp", b.adminTCP) }
	}
	c := &http.Client{Transport: &http.Transport{DialContext: dial}, Timeout: 60 * time.Second}
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, base+path, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

func (b *box) mustAdmin(method, path string, body any, out any) {
	b.t.Helper()
	st, data, err := b.adminCall(method, path, body)
	if err != nil || st >= 300 {
		b.t.Fatalf("%s %s: %d %v %s", method, path, st, err, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			b.t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
	}
}

// space sends a request to host through the box.
func (b *box) space(method, host, path string) (int, []byte, error) {
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return b.dial(ctx, network, b.httpAddr)
	}}, Timeout: 2 * time.Minute}
	req, _ := http.NewRequest(method, "http://"+host+path, nil)
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// spaceClose is space on a fresh connection, so the box dials the instance anew.
func (b *box) spaceClose(method, host, path string) (int, []byte, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return b.dial(ctx, network, b.httpAddr)
	}}, Timeout: time.Minute}
	req, _ := http.NewRequest(method, "http://"+host+path, nil)
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

type attempt struct {
	OK  bool    `json:"ok"`
	Err string  `json:"err"`
	Out string  `json:"out"`
	MS  float64 `json:"ms"` // how long the attempt took, when it says
}

// try asks host's instance to make one attempt (attacker's endpoints).
func (b *box) try(host, op string, q url.Values) attempt {
	b.t.Helper()
	st, data, err := b.space("POST", host, "/"+op+"?"+q.Encode())
	if err != nil || st != 200 {
		b.t.Fatalf("%s %s: %d %v %s", host, op, st, err, data)
	}
	var a attempt
	if err := json.Unmarshal(data, &a); err != nil {
		b.t.Fatalf("%s %s: %v: %s", host, op, err, data)
	}
	return a
}

type spaceStatus struct {
	Host      string `json:"host"`
	State     string `json:"state"`
	PID       int    `json:"pid"`
	LastCrash string `json:"last_crash"`
}

func (b *box) status(host string) spaceStatus {
	b.t.Helper()
	var st struct {
		Spaces   []spaceStatus      `json:"spaces"`
		Counters map[string]float64 `json:"counters"`
	}
	b.mustAdmin("GET", "/lchat/status", nil, &st)
	for _, s := range st.Spaces {
		if s.Host == host {
			return s
		}
	}
	return spaceStatus{}
}

// outsideTmpBase holds the boxes' directories and the attacker: outside /tmp, which an
// instance's private /tmp hides from it (as /var/lib/lchat-caddy is under the unit).
const outsideTmpBase = "/var/lib/lchat-isolation-test"

// outsideTmp returns outsideTmpBase, created 0711.
func outsideTmp(t *testing.T) string {
	t.Helper()
	if err := os.MkdirAll(outsideTmpBase, 0o711); err != nil {
		t.Fatal(err)
	}
	os.Chmod(outsideTmpBase, 0o711)
	return outsideTmpBase
}

// attackerBinary builds the attacker into a directory every uid can reach.
var attackerOnce struct {
	sync.Once
	path string
	err  error
}

func attackerBinary(t *testing.T) string {
	attackerOnce.Do(func() {
		dir, err := os.MkdirTemp(outsideTmp(t), "attacker")
		if err != nil {
			attackerOnce.err = err
			return
		}
		os.Chmod(dir, 0o755)
		out := filepath.Join(dir, "attacker")
		cmd := exec.Command("go", "build", "-o", out, "./tests/isolation/attacker")
		cmd.Dir = harness.RepoRoot()
		if o, err := cmd.CombinedOutput(); err != nil {
			attackerOnce.err = fmt.Errorf("building attacker: %v\n%s", err, o)
			return
		}
		attackerOnce.path = out
	})
	if attackerOnce.err != nil {
		t.Fatal(attackerOnce.err)
	}
	return attackerOnce.path
}

func mustContain(t *testing.T, s, sub string) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Fatalf("%q does not contain %q", s, sub)
	}
}

// TestMain removes the attacker build once every test has run.
func TestMain(m *testing.M) {
	code := m.Run()
	if attackerOnce.path != "" {
		os.RemoveAll(filepath.Dir(attackerOnce.path))
	}
	os.Exit(code)
}
