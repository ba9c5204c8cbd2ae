package single

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	spacepkg "github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// TestMaxAwakeWithSSEHolders: under max_awake 2, two spaces each held by an open SSE
// stream stay awake and a third space's wake is refused with 503 and Retry-After (the
// cap holds; nobody's stream is cut for it). Once one stream closes, its idle space
// sleeps to make room and the third wakes.
func TestMaxAwakeWithSSEHolders(t *testing.T) {
	e := newEnv(t)
	cfg := harness.Config{Lchat: map[string]any{
		"max_awake": 2,
		"kinds":     map[string]any{"demo": harness.DemoKind(map[string]any{"idle_timeout": "10m"})},
	}}.JSON()
	b := harness.StartBox(t, harness.BoxOptions{JSON: cfg, Env: e.s3.Env(e.prefix)})
	hosts := []string{"h1.example.com", "h2.example.com", "h3.example.com"}
	for _, h := range hosts {
		createSpace(t, b, h)
	}
	var cancels []context.CancelFunc
	for _, h := range hosts[:2] {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", b.URL(h, "/api/events"), nil)
		resp, err := b.Client().Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("SSE to %s: %v %v", h, resp, err)
		}
		defer resp.Body.Close()
	}
	req, _ := http.NewRequest("GET", b.URL(hosts[2], "/api/messages"), nil)
	resp, err := b.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("wake over the cap with both awake spaces streaming: %d Retry-After %q, want 503 with Retry-After",
			resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	awake := 0
	for _, h := range hosts {
		if st, _ := space(t, b, h); st == "awake" {
			awake++
		}
	}
	if st1, _ := space(t, b, hosts[0]); awake != 2 || st1 != "awake" {
		t.Fatalf("%d spaces awake (h1 %s) under max_awake 2 with two streams open", awake, st1)
	}
	cancels[0]() // h1's stream closes: h1 is idle and may sleep for h3
	harness.WaitFor(t, 30*time.Second, "h3 to wake once h1 is idle", func() bool {
		code, _ := do(t, b, "GET", hosts[2], "/api/messages", "")
		return code == 200
	})
	if st, _ := space(t, b, hosts[1]); st != "awake" {
		t.Fatalf("h2, still streaming, is %s", st)
	}
	if st, _ := space(t, b, hosts[0]); st != "asleep" {
		t.Fatalf("h1 is %s after h3 woke in its place, want asleep", st)
	}
}

// floodBox sends GETs for host from 16 clients for d and returns the status counts; it
// fails the test on a 502 or a 503 without Retry-After.
func floodBox(t *testing.T, b *harness.Box, host string, d time.Duration) map[int]int {
	t.Helper()
	var mu sync.Mutex
	codes := map[int]int{}
	var bad []string
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				req, _ := http.NewRequest("GET", b.URL(host, "/api/messages"), nil)
				resp, err := b.Client().Do(req)
				if err != nil {
					continue
				}
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				if resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
					bad = append(bad, fmt.Sprintf("%d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After")))
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("flood of %s: %d bad answers, first %s", host, len(bad), bad[0])
	}
	return codes
}

// TestFailedWakeBacksOffOnS3: a real box on versitygw, its bucket traffic through a TCP
// proxy. A flood of requests to a space whose blob is corrupt, then to a space while the
// bucket is cut, makes one wake attempt per backoff step (1s, 2s, ...), not one per
// request; every refusal is a 503 with Retry-After, never a 502.
func TestFailedWakeBacksOffOnS3(t *testing.T) {
	e := newEnv(t)
	proxy := harness.StartTCPProxy(t, strings.TrimPrefix(e.s3.Config("").Endpoint, "http://"))
	env := e.s3.Env(e.prefix)
	for i, kv := range env {
		if strings.HasPrefix(kv, "AWS_ENDPOINT_URL_S3=") {
			env[i] = "AWS_ENDPOINT_URL_S3=http://" + proxy.Addr()
		}
	}
	b := harness.StartBox(t, harness.BoxOptions{JSON: boxConfig(cfgOpts{}), Env: env})
	ctx := context.Background()

	const corrupt = "corrupt.example.com"
	sum := sha256.Sum256([]byte("the real bytes"))
	hexSum := hex.EncodeToString(sum[:])
	if _, err := e.bkt.Put(ctx, spacepkg.BlobKey(corrupt, hexSum), strings.NewReader("corrupted!"), 10, bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	if _, err := spacepkg.WriteManifest(ctx, e.bkt, corrupt, &spacepkg.Manifest{Generation: 1,
		Files: []spacepkg.File{{Path: "chat.db", Size: 14, SHA256: hexSum, Mode: 0o600}}}, ""); err != nil {
		t.Fatal(err)
	}
	createSpace(t, b, corrupt)
	// Each restore attempt logs its failure once ("restoring data dir"); each wake
	// attempt with the bucket cut fails on the lease ("acquiring lease").
	restores := func() int { return strings.Count(b.Logs(), "restoring data dir") }
	leases := func() int { return strings.Count(b.Logs(), "acquiring lease") }
	codes := floodBox(t, b, corrupt, 2500*time.Millisecond)
	fails := getStatus(t, b).Counters["wake_failures"]
	t.Logf("FIGURE corrupt blob: %v answers in 2.5s, %d restore attempts (wake_failures %v)", codes, restores(), fails)
	if n := restores(); n < 1 || n > 2 {
		t.Fatalf("corrupt blob: %d restore attempts under a 2.5s flood, want 1 or 2 (backoff 1s, 2s)", n)
	}
	// What a client of the failing space gets: a 503 with Retry-After and a page that
	// says when to try again, and nothing of the box's reason.
	req, _ := http.NewRequest("GET", b.URL(corrupt, "/api/messages"), nil)
	req.Header.Set("Accept", "application/json")
	resp, err := b.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var p struct {
		Status     int    `json:"status"`
		Host       string `json:"host"`
		RetryAfter int    `json:"retry_after"`
	}
	if err := json.Unmarshal(page, &p); err != nil || resp.StatusCode != 503 || p.Status != 503 || p.Host != corrupt ||
		strconv.Itoa(p.RetryAfter) != resp.Header.Get("Retry-After") || strings.Contains(string(page), "restore") {
		t.Fatalf("a request to the failing space: %d Retry-After %q %s (%v), want 503 with a page giving the same Retry-After",
			resp.StatusCode, resp.Header.Get("Retry-After"), page, err)
	}

	const cut = "cut.example.com"
	createSpace(t, b, cut)
	proxy.SetDown(true)
	before := leases()
	codes = floodBox(t, b, cut, 2500*time.Millisecond)
	proxy.SetDown(false)
	t.Logf("FIGURE bucket cut: %v answers in 2.5s, %d wake attempts", codes, leases()-before)
	if n := leases() - before; n < 1 || n > 2 {
		t.Fatalf("bucket cut: %d wake attempts under a 2.5s flood, want 1 or 2", n)
	}
	// Healed: the space wakes once its backoff has passed.
	harness.WaitFor(t, 30*time.Second, "the cut space to wake after the bucket is back", func() bool {
		code, _ := do(t, b, "GET", cut, "/api/messages", "")
		return code == 200
	})
}

// TestInstanceDiesMidRequestIs503: a request already handed to the instance when the
// instance dies (a crash here; a fence or a stop does the same) gets a 503 with
// Retry-After, never a 502 (the fault campaign's contract), and the space wakes again.
func TestInstanceDiesMidRequestIs503(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{})
	const host = "midrequest.example.com"
	createSpace(t, b, host)
	postMessage(t, b, host, "before")
	_, pid := space(t, b, host)
	if pid == 0 {
		t.Fatal("no PID for an awake space")
	}
	// A write whose body is still arriving when the instance dies.
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", b.URL(host, "/api/messages"), pr)
	req.Header.Set("Content-Type", "application/json")
	type answer struct {
		resp *http.Response
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := b.Client().Do(req)
		got <- answer{resp, err}
	}()
	if _, err := pw.Write([]byte(`{"author":"t","text":"half`)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the proxy has sent the head to the instance
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The rest of the body arrives after the death: once the box has reaped the instance.
	harness.WaitFor(t, 10*time.Second, "the killed instance reaped", func() bool { return syscall.Kill(pid, 0) != nil })
	pw.Write([]byte(`"}`))
	pw.Close()
	var a answer
	select {
	case a = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("no answer 30s after the instance died")
	}
	if a.err != nil {
		t.Fatalf("write to a dying instance: %v, want a 503", a.err)
	}
	a.resp.Body.Close()
	if a.resp.StatusCode != http.StatusServiceUnavailable || a.resp.Header.Get("Retry-After") == "" {
		t.Fatalf("write to a dying instance: %d Retry-After %q, want 503 with Retry-After", a.resp.StatusCode, a.resp.Header.Get("Retry-After"))
	}
	harness.WaitFor(t, 30*time.Second, "the space answers again", func() bool {
		code, _ := do(t, b, "GET", host, "/api/messages", "")
		return code == 200
	})
	if got := messages(t, b, host); !strings.Contains(got, "before") {
		t.Fatalf("message lost: %s", got)
	}
}

// TestUnreachableInstanceIsReplaced: an awake space whose socket disappears (the engine
// believes it awake, every dial fails) answers 503 with Retry-After for a moment and is
// then woken again, instead of failing every request until something else ends its awake
// period (the fault campaign saw 86 s of it).
func TestUnreachableInstanceIsReplaced(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{})
	const host = "unreachable.example.com"
	createSpace(t, b, host)
	postMessage(t, b, host, "before")
	_, pid := space(t, b, host)
	socks, _ := filepath.Glob(filepath.Join(b.Dir, "state", "proxy", "*.sock"))
	if len(socks) != 1 {
		t.Fatalf("proxy sockets %v, want the one of %s", socks, host)
	}
	if err := os.Remove(socks[0]); err != nil {
		t.Fatal(err)
	}
	// Connections the proxy already holds still reach the instance; concurrent requests
	// make it dial, and those dials fail.
	var mu sync.Mutex
	codes := map[int]int{}
	var noRetryAfter int
	for burst := 0; codes[http.StatusServiceUnavailable] == 0 && burst < 50; burst++ {
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := b.Client().Get(b.URL(host, "/api/messages"))
				if err != nil {
					return
				}
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
					noRetryAfter++
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	if codes[http.StatusServiceUnavailable] == 0 || noRetryAfter > 0 || codes[http.StatusBadGateway] > 0 {
		t.Fatalf("requests once the socket is gone: %v (%d 503s without Retry-After), want 503s with Retry-After", codes, noRetryAfter)
	}
	harness.WaitFor(t, 30*time.Second, "the space answers again from a new instance", func() bool {
		code, _ := do(t, b, "GET", host, "/api/messages", "")
		_, now := space(t, b, host)
		return code == 200 && now != 0 && now != pid
	})
	if got := messages(t, b, host); !strings.Contains(got, "before") {
		t.Fatalf("message lost: %s", got)
	}
}
