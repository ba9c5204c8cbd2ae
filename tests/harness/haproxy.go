package harness

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// HAProxyOptions configures StartHAProxy: a network load balancer in TCP mode in front of
// boxes, which checks each box's health over HTTP and sends the PROXY protocol v2.
type HAProxyOptions struct {
	// IP is the loopback address clients connect to. Default 127.0.0.1.
	IP string
	// Source is the address HAProxy connects to the boxes from (its `source`): the one
	// address the boxes accept a PROXY header from. Required.
	Source string
	// CheckPath is the health check's path. Default "/".
	CheckPath string
	// Inter is the health check interval. Default 200ms. A box is counted down after 2
	// failed checks and up after 1 good one.
	Inter time.Duration
}

// HAProxy is a running haproxy (Debian's package; scripts/test installs it) with its
// runtime API on an admin-level Unix socket: servers are added and removed there, as an
// autoscaling group's hooks would.
type HAProxy struct {
	// Addr is ip:port of the frontend clients connect to.
	Addr string

	t     testing.TB
	sock  string
	inter time.Duration
	cmd   *exec.Cmd
	logs  *SyncBuffer
}

// StartHAProxy starts haproxy with an empty backend and stops it when the test ends.
func StartHAProxy(t testing.TB, o HAProxyOptions) *HAProxy {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Fatal("haproxy not found: apt-get install haproxy (scripts/test installs it)")
	}
	if o.IP == "" {
		o.IP = "127.0.0.1"
	}
	if o.Source == "" {
		t.Fatal("StartHAProxy: Source is required")
	}
	if o.CheckPath == "" {
		o.CheckPath = "/"
	}
	if o.Inter <= 0 {
		o.Inter = 200 * time.Millisecond
	}
	dir, err := os.MkdirTemp("", "hap")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &HAProxy{Addr: FreeAddr(t, o.IP), t: t, sock: filepath.Join(dir, "admin.sock"), logs: new(SyncBuffer), inter: o.Inter}
	// retries and redispatch: a connection to a box whose listener just closed goes to
	// another box, as a cloud balancer's does.
	cfg := fmt.Sprintf(`global
	stats socket %s mode 600 level admin
	log stderr format short local0 notice
defaults
	mode tcp
	log global
	option tcplog
	timeout connect 2s
	timeout client 5m
	timeout server 5m
	retries 3
	option redispatch 1
frontend lb
	bind %s
	default_backend boxes
backend boxes
	balance roundrobin
	option httpchk GET %s
	http-check expect status 200
	source %s
`, h.sock, h.Addr, o.CheckPath, o.Source)
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	h.cmd = exec.Command(bin, "-db", "-f", path)
	h.cmd.Stdout, h.cmd.Stderr = h.logs, h.logs
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.cmd.Process.Kill()
		h.cmd.Wait()
		if t.Failed() {
			t.Logf("haproxy log tail:\n%s", lastLines(h.logs.String(), 40))
		}
	})
	WaitFor(t, 10*time.Second, "haproxy's runtime API", func() bool {
		_, err := h.Cmd("show info")
		return err == nil
	}, func() string { return lastLines(h.logs.String(), 10) })
	return h
}

// Cmd runs one command on the runtime API and returns its answer.
func (h *HAProxy) Cmd(line string) (string, error) {
	c, err := net.DialTimeout("unix", h.sock, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	var b strings.Builder
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
	}
	return strings.TrimSpace(b.String()), sc.Err()
}

// must runs each command and fails the test on an error or an answer that is not one of
// HAProxy's acknowledgements (empty, or "New server registered.", "Server deleted.").
func (h *HAProxy) must(lines ...string) {
	h.t.Helper()
	for _, l := range lines {
		out, err := h.Cmd(l)
		if err != nil || (out != "" && out != "New server registered." && out != "Server deleted.") {
			h.t.Fatalf("haproxy %q: %q %v", l, out, err)
		}
	}
}

// AddServer adds a box to the backend, as an autoscaling group's launch hook registers a
// new instance: traffic to addr with the PROXY protocol v2, health checks to checkPort. It
// takes connections once its first check passes.
func (h *HAProxy) AddServer(name, addr, checkPort string) {
	h.t.Helper()
	// A server added at run time takes nothing from default-server: its check settings
	// are all here.
	h.must(fmt.Sprintf("add server boxes/%s %s check port %s inter %dms fall 2 rise 1 send-proxy-v2",
		name, addr, checkPort, h.inter.Milliseconds()),
		"enable health boxes/"+name, "enable server boxes/"+name)
}

// DelServer removes a box from the backend, as a terminated instance is deregistered.
func (h *HAProxy) DelServer(name string) {
	h.t.Helper()
	h.must("disable server boxes/"+name, "shutdown sessions server boxes/"+name, "del server boxes/"+name)
}

// State is a server's status as HAProxy sees it: UP, DOWN, MAINT, ... ("" when unknown).
func (h *HAProxy) State(name string) string {
	out, err := h.Cmd("show stat")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Split(l, ",")
		if len(f) > 17 && f[0] == "boxes" && f[1] == name {
			return strings.Fields(f[17] + " ")[0]
		}
	}
	return ""
}
