// Package meshe2e runs three real lchat-caddy processes on 127.0.0.1, .2 and .3 against
// one real S3 (versitygw) with the real demo space, TLS between the boxes from a test
// CA, and checks what an operator of a mesh relies on: membership, placement,
// one-hop forwarding, replication, mesh-seed, fencing and failover.
package meshe2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

const (
	meshDomain = "mesh.test"
	meshToken  = "test-mesh-token-3f9a1c-5d7e9f0b2c4a6e8d"
	beat       = time.Second
	deadAfter  = 3 * time.Second
)

// node is one box of the cluster.
type node struct {
	*harness.Box
	ip   string
	addr string // ip:port of its HTTPS listener
	self string // its LCHAT_MESH_SELF
	// bucketProxy sits between the box and versitygw when the box was started with one.
	bucketProxy *harness.TCPProxy
	// peer, in a cluster started with peered, is in front of the box's listener and is its
	// SELF: what other boxes send it (forwards, a stream, a watch) goes through it.
	peer *harness.TCPProxy
}

type cluster struct {
	t      *testing.T
	s3     *harness.S3
	prefix string
	ca     *harness.TestCA
	nodes  []*node
	// env is added to every box started from now on.
	env []string
	// kind overrides options of the demo kind of boxes started from now on.
	kind map[string]any
	// mesh adds options to the mesh block of boxes started from now on.
	mesh map[string]any
	// lchat adds options to the lchat app of boxes started from now on.
	lchat map[string]any
	// peered puts a TCP proxy in front of each box started from now on, as its SELF
	// (node.peer), so the test can cut the boxes apart.
	peered bool
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	dir := t.TempDir()
	c := &cluster{
		t:      t,
		s3:     harness.StartS3(t),
		prefix: fmt.Sprintf("m%d", time.Now().UnixNano()%1e9),
		ca:     harness.NewTestCA(t, dir, meshDomain, xDomain, yDomain),
	}
	// Whatever the test did (replication, seeds, failover, drains), no box logged a
	// secret: the mesh token, the S3 secret key or a route's env value. Box cleanups
	// run first (registered later); the logs stay in memory.
	t.Cleanup(func() {
		for _, n := range c.nodes {
			logs := n.Logs()
			for name, secret := range map[string]string{"the mesh token": meshToken,
				"the S3 secret key": c.s3.SecretKey, "an env value": "s3cr3t-env-value"} {
				if strings.Contains(logs, secret) {
					t.Errorf("%s logged %s", n.self, name)
				}
			}
		}
	})
	return c
}

// boxConfig is the JSON config of one mesh box: the lchat app on the shared bucket with
// short mesh intervals, an HTTPS server with the shared wildcard certificate, the peer
// API on the SELF host and the lchat handler for everything else.
func (c *cluster) boxConfig(n *node) string {
	meshOpts := map[string]any{
		"beat": beat.String(), "dead_after": deadAfter.String(),
		"trusted_ca_files": []string{c.ca.CAFile},
	}
	for k, v := range c.mesh {
		meshOpts[k] = v
	}
	app := map[string]any{
		"wake_scan_interval": "1s",
		"mesh":               meshOpts,
		"kinds":              map[string]any{"demo": harness.DemoKind(c.kindOpts())},
	}
	for k, v := range c.lchat {
		app[k] = v
	}
	return harness.Config{
		Listen:      n.addr,
		Lchat:       app,
		MeshAPIHost: n.ip,
		CertFile:    c.ca.CertFile,
		KeyFile:     c.ca.KeyFile,
	}.JSON()
}

func (c *cluster) kindOpts() map[string]any {
	k := map[string]any{
		"idle_timeout": "10m",
		"replication":  map[string]any{"class": "periodic", "interval": "1s"},
		"allowed_env":  []string{"DEMO_SECRET"},
	}
	for key, v := range c.kind {
		k[key] = v
	}
	return k
}

// start starts box number i (0-based) on 127.0.0.(i+1); withProxy routes its bucket
// traffic through a TCP proxy the test can cut.
func (c *cluster) start(withProxy bool) *node {
	t := c.t
	t.Helper()
	ip := fmt.Sprintf("127.0.0.%d", len(c.nodes)+1)
	n := &node{ip: ip}
	n.addr = net.JoinHostPort(ip, harness.FreePort(t, ip))
	n.self = "https://" + n.addr
	if c.peered {
		n.peer = harness.StartTCPProxyOn(t, ip, n.addr)
		n.self = "https://" + n.peer.Addr()
	}
	env := c.s3.Env(c.prefix)
	if withProxy {
		n.bucketProxy = harness.StartTCPProxy(t, strings.TrimPrefix(c.s3.Endpoint, "http://"))
		for i, kv := range env {
			if strings.HasPrefix(kv, "AWS_ENDPOINT_URL_S3=") {
				env[i] = "AWS_ENDPOINT_URL_S3=http://" + n.bucketProxy.Addr()
			}
		}
	}
	env = append(env,
		mesh.EnvSelf+"="+n.self,
		mesh.EnvDomains+"="+meshDomain,
		mesh.EnvToken+"="+meshToken,
	)
	env = append(env, c.env...)
	n.Box = harness.StartBox(t, harness.BoxOptions{JSON: c.boxConfig(n), Env: env, IP: ip})
	c.nodes = append(c.nodes, n)
	return n
}

// client sends every request to n's HTTPS listener, verifying the shared certificate
// against the URL's host with the test CA.
func (c *cluster) client(n *node) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, n.addr)
			},
			TLSClientConfig:     &tls.Config{RootCAs: c.ca.Pool},
			MaxIdleConnsPerHost: 64,
		},
		Timeout: time.Minute,
	}
}

type boxStatus struct {
	Spaces []struct {
		Host     string     `json:"host"`
		State    string     `json:"state"`
		PID      int        `json:"pid"`
		LastSync *time.Time `json:"last_sync"`
		// Log is the space's log and output gate (durability bucket), as the box says it.
		Log json.RawMessage `json:"log"`
		// WarmGeneration: asleep with that checkpoint in place (a standby's copy);
		// KeptDataDir: awake from a wake that downloaded no checkpoint.
		WarmGeneration *int64 `json:"warm_generation"`
		KeptDataDir    bool   `json:"kept_data_dir"`
	} `json:"spaces"`
	Mesh *struct {
		Self     string            `json:"self"`
		Fenced   bool              `json:"fenced"`
		Awake    []string          `json:"awake"`
		Live     []string          `json:"live_members"`
		Counters map[string]uint64 `json:"counters"`
	} `json:"mesh"`
}

func status(t *testing.T, n *node) boxStatus {
	t.Helper()
	var st boxStatus
	n.AdminJSON("GET", "/lchat/status", nil, 200, &st)
	if st.Mesh == nil {
		t.Fatalf("%s: /lchat/status has no mesh section", n.self)
	}
	return st
}

// tryStatus is status for pollers that must not fail the test from a goroutine.
func tryStatus(n *node) (boxStatus, bool) {
	code, data, err := n.Admin("GET", "/lchat/status", nil)
	var st boxStatus
	if err != nil || code != 200 || json.Unmarshal(data, &st) != nil || st.Mesh == nil {
		return st, false
	}
	return st, true
}

func (st boxStatus) awake(host string) bool {
	for _, s := range st.Spaces {
		if s.Host == host && s.State == "awake" {
			return true
		}
	}
	return false
}

func (st boxStatus) lastSync(host string) time.Time {
	for _, s := range st.Spaces {
		if s.Host == host && s.LastSync != nil {
			return *s.LastSync
		}
	}
	return time.Time{}
}

// waitSynced waits until n has checkpointed host with a snapshot taken after since. The
// first sync to finish after since may have taken its snapshot before it (a sync's time
// is when it ended), so it waits for the next one, which started after that.
func waitSynced(t *testing.T, n *node, host string, since time.Time) {
	t.Helper()
	var first time.Time
	harness.WaitFor(t, 10*time.Second, "a sync of "+host+" that started after the write", func() bool {
		ls := status(t, n).lastSync(host)
		if first.IsZero() {
			if ls.After(since) {
				first = ls
			}
			return false
		}
		return ls.After(first)
	})
}

func (c *cluster) do(n *node, method, host, path, body string, hdr http.Header) (int, string, error) {
	code, _, data, err := c.doH(n, method, host, path, body, hdr)
	return code, data, err
}

// doH is do with the response headers.
func (c *cluster) doH(n *node, method, host, path, body string, hdr http.Header) (int, http.Header, string, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "https://"+host+path, rd)
	if err != nil {
		return 0, nil, "", err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.client(n).Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data), nil
}

func (c *cluster) mustDo(n *node, method, host, path, body string, want int) string {
	c.t.Helper()
	code, data, err := c.do(n, method, host, path, body, nil)
	if err != nil {
		c.t.Fatalf("%s https://%s%s via %s: %v", method, host, path, n.self, err)
	}
	if code != want {
		c.t.Fatalf("%s https://%s%s via %s: %d, want %d: %.300s", method, host, path, n.self, code, want, data)
	}
	return data
}

func (c *cluster) post(n *node, host, text string) {
	c.t.Helper()
	c.mustDo(n, "POST", host, "/api/messages", fmt.Sprintf(`{"author":"test","text":%q}`, text), http.StatusCreated)
}

// members is the live fleet as the test knows it, for predicting placement.
func members(nodes ...*node) []mesh.Member {
	var out []mesh.Member
	for _, n := range nodes {
		out = append(out, mesh.Member{Self: n.self})
	}
	return out
}

// hostOwnedBy finds a fresh host whose HRW owner among live is want.
func hostOwnedBy(t *testing.T, tag string, want *node, live ...*node) string {
	t.Helper()
	for i := 0; i < 10000; i++ {
		h := fmt.Sprintf("%s%d.%s", tag, i, meshDomain)
		if o, ok := mesh.Owner(h, members(live...), ""); ok && o.Self == want.self {
			return h
		}
	}
	t.Fatalf("no host owned by %s", want.self)
	return ""
}

func (c *cluster) createSpace(n *node, host string) {
	c.t.Helper()
	n.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "demo",
		"env": map[string]string{"DEMO_SECRET": "s3cr3t-env-value"}}, http.StatusCreated, nil)
}

func hasRoute(n *node, host string) bool {
	code, _, err := n.Admin("GET", "/lchat/routes/"+host, nil)
	return err == nil && code == 200
}

func awakeOn(t *testing.T, host string, nodes ...*node) []string {
	var out []string
	for _, n := range nodes {
		if status(t, n).awake(host) {
			out = append(out, n.self)
		}
	}
	slices.Sort(out)
	return out
}
