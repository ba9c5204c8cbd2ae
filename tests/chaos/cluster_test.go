package chaos

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/tests/harness"
)

const (
	meshDomain = "chaos.test"
	meshToken  = "test-chaos-token-8b1d3f-2a4c6e8f0b1d3f5a7c9e"
	beat       = time.Second
	deadAfter  = 3 * time.Second
	// idleTimeout is short so that a space its clients leave alone (the relocate fault)
	// sleeps soon; spaces in use never idle that long.
	idleTimeout = 4 * time.Second
)

// The campaign's three kinds: the same demo space, acknowledging at three durabilities.
const (
	// kindBucket answers a write once its commit is in the space's log in the bucket:
	// no fault may take a write it answered 201 for.
	kindBucket = "demo-bucket"
	// kindStandby answers a write once the space's standby box has fsynced it (or the
	// bucket log holds it, when the space has no standby): no fault may take a write it
	// answered 201 for either.
	kindStandby = "demo-standby"
	// kindCheckpoint answers at once; a write survives its box's hard death once a
	// checkpoint (every second) holds it. The package's other tests use it.
	kindCheckpoint = "demo"
)

// regions: the boxes alternate between two regions on the one bucket, so relocate can
// move a space's home between them.
var regions = []string{"r0", "r1"}

// node is one box of the campaign, its bucket traffic through its own TCP proxy.
type node struct {
	*harness.Box
	i     int
	ip    string
	addr  string            // ip:port of its HTTPS listener
	self  string            // its LCHAT_MESH_SELF
	proxy *harness.TCPProxy // between the box and its bucket
	// peer is in front of the box's HTTPS listener and is its SELF: every forward and
	// replication from the other boxes comes through it (and can be delayed, reordered).
	peer   *harness.TCPProxy
	region string
	http   *http.Client // to its HTTPS listener
	admin  *http.Client // to its admin API, with a timeout (a stopped box never answers)

	mu      sync.Mutex
	stopped bool // SIGSTOPped: the admin poller leaves it alone

	// impaired counts the starts and heals of faults that take the box or its bucket
	// away (odd: one is on). An admin call made through the box while it changed, or
	// while it is odd, may fail without the product being at fault.
	impaired atomic.Int64
}

type cluster struct {
	t      *testing.T
	s3     *harness.S3
	prefix string
	ca     *harness.TestCA
	nodes  []*node
}

func newCluster(t *testing.T, boxes int) *cluster {
	t.Helper()
	c := &cluster{
		t:      t,
		s3:     harness.StartS3(t),
		prefix: fmt.Sprintf("c%d", time.Now().UnixNano()%1e9),
		ca:     harness.NewTestCA(t, t.TempDir(), meshDomain),
	}
	for range boxes {
		c.start()
	}
	t.Cleanup(func() {
		// A box left SIGSTOPped would not die of SIGTERM; SIGKILL works on it anyway.
		for _, n := range c.nodes {
			if !n.Exited() {
				syscall.Kill(n.PID(), syscall.SIGCONT)
			}
		}
		for _, n := range c.nodes {
			logs := n.Logs()
			for name, secret := range map[string]string{"the mesh token": meshToken, "the S3 secret key": c.s3.SecretKey} {
				if strings.Contains(logs, secret) {
					t.Errorf("%s logged %s", n.self, name)
				}
			}
		}
	})
	return c
}

func (c *cluster) boxConfig(n *node) string {
	return harness.Config{
		Listen: n.addr,
		Lchat: map[string]any{
			"wake_scan_interval": "1s",
			"mesh": map[string]any{
				"beat": beat.String(), "dead_after": deadAfter.String(), "resync_interval": "5s",
				"trusted_ca_files": []string{c.ca.CAFile},
			},
			"kinds": map[string]any{kindCheckpoint: demoKind("checkpoint"), kindBucket: demoKind("bucket"), kindStandby: demoKind("standby")},
		},
		MeshAPIHost: n.ip,
		CertFile:    c.ca.CertFile,
		KeyFile:     c.ca.KeyFile,
		LogLevel:    logLevel(),
	}.JSON()
}

// demoKind is the campaign's demo kind at durability: the same idle timeout and
// checkpoints every second for all three, so that only the acknowledgement differs.
func demoKind(durability string) map[string]any {
	return harness.DemoKind(map[string]any{
		"idle_timeout": idleTimeout.String(),
		"replication":  map[string]any{"class": "periodic", "interval": "1s"},
		"durability":   durability,
	})
}

// start starts box number len(c.nodes) on 127.0.0.(i+1), its bucket behind a TCP proxy,
// with the instance header on (responses name the instance that answered).
func (c *cluster) start() *node {
	t := c.t
	t.Helper()
	i := len(c.nodes)
	ip := fmt.Sprintf("127.0.0.%d", i+1)
	n := &node{i: i, ip: ip}
	n.addr = net.JoinHostPort(ip, harness.FreePort(t, ip))
	n.peer = harness.StartTCPProxyOn(t, ip, n.addr)
	n.self = "https://" + n.peer.Addr()
	n.region = regions[i%len(regions)]
	n.proxy = harness.StartTCPProxy(t, strings.TrimPrefix(c.s3.Endpoint, "http://"))
	env := c.s3.Env(c.prefix)
	for j, kv := range env {
		if strings.HasPrefix(kv, "AWS_ENDPOINT_URL_S3=") {
			env[j] = "AWS_ENDPOINT_URL_S3=http://" + n.proxy.Addr()
		}
	}
	env = append(env,
		mesh.EnvSelf+"="+n.self,
		mesh.EnvDomains+"="+meshDomain,
		mesh.EnvToken+"="+meshToken,
		mesh.EnvRegion+"="+n.region,
		"LCHAT_TEST_INSTANCE_HEADER=1",
	)
	n.Box = harness.StartBox(t, harness.BoxOptions{JSON: c.boxConfig(n), Env: env, IP: ip})
	d := &net.Dialer{Timeout: 3 * time.Second}
	n.http = &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, n.addr)
			},
			TLSClientConfig:     &tls.Config{RootCAs: c.ca.Pool},
			MaxIdleConnsPerHost: 16,
		},
		Timeout: 15 * time.Second,
	}
	n.admin = &http.Client{Timeout: 2 * time.Second}
	c.nodes = append(c.nodes, n)
	return n
}

// waitAllLive waits until every box sees every box live.
func (c *cluster) waitAllLive() {
	c.t.Helper()
	harness.WaitFor(c.t, 30*time.Second, "every box to see every box live", func() bool {
		for _, n := range c.nodes {
			var st struct {
				Mesh struct {
					Live []string `json:"live_members"`
				} `json:"mesh"`
			}
			if n.adminGet("/lchat/status", &st) != nil || len(st.Mesh.Live) != len(c.nodes) {
				return false
			}
		}
		return true
	})
}

// postMessage posts one message to the demo space host through the box's HTTPS listener.
func (n *node) postMessage(host, text string) (*http.Response, error) {
	req, _ := http.NewRequest("POST", "https://"+host+"/api/messages", strings.NewReader(fmt.Sprintf(`{"author":"t","text":%q}`, text)))
	req.Header.Set("Content-Type", "application/json")
	return n.http.Do(req)
}

// adminGet reads an admin endpoint with a timeout, decoding JSON into out.
func (n *node) adminGet(path string, out any) error {
	resp, err := n.admin.Get(n.AdminURL + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, data)
	}
	return json.Unmarshal(data, out)
}

// adminDo sends a JSON request to the admin API with a timeout.
func (n *node) adminDo(method, path string, body any) (int, string, error) {
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = strings.NewReader(string(data))
	}
	req, err := http.NewRequest(method, n.AdminURL+path, rd)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{Timeout: time.Minute}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data), nil
}

type boxStatus struct {
	// Mesh carries the box's standby totals: its takeovers since it started, the last
	// ones listed.
	Mesh *struct {
		StandbyTotals *struct {
			Recent []takeover `json:"recent_takeovers"`
		} `json:"standby_totals"`
	} `json:"mesh"`
	Spaces []struct {
		Host     string     `json:"host"`
		State    string     `json:"state"`
		LastSync *time.Time `json:"last_sync"`
		// Durability is the space's kind's; Log its log and output gate (bucket
		// durability, awake here).
		Durability string     `json:"durability"`
		Log        *logStatus `json:"log"`
	} `json:"spaces"`
}

// logStatus is the part of a space's log and output gate (engine.DurableStatus) the
// campaign reads.
type logStatus struct {
	Segments uint64 `json:"segments"`
	Failed   uint64 `json:"failed"`
	// Standby is the space's stream (durability standby): its standby box, or why it has
	// none, and the segments the standby took since the wake.
	Standby *streamStatus `json:"standby"`
}

// streamStatus is a standby space's stream (engine.StandbyStatus).
type streamStatus struct {
	Box       string `json:"box"`
	NoStandby string `json:"no_standby"`
	Streamed  uint64 `json:"streamed"`
}

// standby is the log's stream, nil when there is no log or no stream.
func (l *logStatus) standby() *streamStatus {
	if l == nil {
		return nil
	}
	return l.Standby
}

// takeover is one of a box's recent takeovers of a space from a dead holder
// (engine.Takeover).
type takeover struct {
	Host   string    `json:"host"`
	Holder string    `json:"holder"`
	Why    string    `json:"why"`
	At     time.Time `json:"at"`
	Took   int64     `json:"took_ns"`
	Err    string    `json:"error"`
}

// lastSync is when the box last checkpointed host (zero when it cannot tell).
func (n *node) lastSync(host string) time.Time {
	var st boxStatus
	if n.adminGet("/lchat/status", &st) != nil {
		return time.Time{}
	}
	for _, sp := range st.Spaces {
		if sp.Host == host && sp.LastSync != nil {
			return *sp.LastSync
		}
	}
	return time.Time{}
}

// routes lists the box's registry as host -> kind/rev.
func (n *node) routes() (map[string]string, error) {
	out := map[string]string{}
	after := ""
	for {
		var page struct {
			Routes []struct {
				Host string `json:"host"`
				Kind string `json:"kind"`
				Rev  string `json:"rev"`
			} `json:"routes"`
			Next string `json:"next"`
		}
		if err := n.adminGet("/lchat/routes?limit=1000&after="+after, &page); err != nil {
			return nil, err
		}
		for _, r := range page.Routes {
			out[r.Host] = r.Kind + " " + r.Rev
		}
		if page.Next == "" {
			return out, nil
		}
		after = page.Next
	}
}

// logLevel is the boxes' log level: WARN, or $LCHAT_CHAOS_LOGLEVEL (INFO to follow
// replication and wakes in a failed campaign's logs, with LCHAT_TEST_LOGDIR).
func logLevel() string {
	if l := os.Getenv("LCHAT_CHAOS_LOGLEVEL"); l != "" {
		return l
	}
	return "WARN"
}
