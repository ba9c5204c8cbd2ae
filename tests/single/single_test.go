// Package single runs one real lchat-caddy box against a real S3 (versitygw) with the
// real demo space, and checks what an operator and a space's users rely on.
package single

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/lchat/lchat-caddy/bucket"
	lspace "github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
)

type cfgOpts struct {
	Idle        string // demo idle_timeout
	Replication string // demo periodic interval
	Durability  string // demo durability; "": the default (bucket)
	WakeScan    string
}

// boxConfig is the JSON config of a single box on the harness's S3.
func boxConfig(o cfgOpts) string {
	if o.Idle == "" {
		o.Idle = "10m"
	}
	if o.Replication == "" {
		o.Replication = "1s"
	}
	if o.WakeScan == "" {
		o.WakeScan = "1s"
	}
	demo := map[string]any{
		"idle_timeout": o.Idle,
		"replication":  map[string]any{"class": "periodic", "interval": o.Replication},
		"allowed_env":  []string{"DEMO_SECRET"},
	}
	if o.Durability != "" {
		demo["durability"] = o.Durability
	}
	return harness.Config{Lchat: map[string]any{
		"wake_scan_interval": o.WakeScan,
		"kinds": map[string]any{
			"demo": harness.DemoKind(demo),
			// The demo with a short idle timeout, for tests that need a space
			// to fall asleep on its own while other kinds stay up.
			"nap": harness.DemoKind(map[string]any{"idle_timeout": "1s", "replication": map[string]any{"class": "sleep"}}),
			// A kind whose instance never becomes ready.
			"stuck": map[string]any{
				"command": "/bin/sleep", "args": []string{"600"},
				"ready_timeout": "1s", "stop_grace": "1s",
			},
		},
	}}.JSON()
}

type env struct {
	s3     *harness.S3
	prefix string
	bkt    bucket.Bucket
}

func newEnv(t *testing.T) *env {
	s3 := harness.StartS3(t)
	prefix := "t" + fmt.Sprint(time.Now().UnixNano()%1e9)
	return &env{s3: s3, prefix: prefix, bkt: s3.NewBucket(t, prefix)}
}

func (e *env) box(t *testing.T, o cfgOpts) *harness.Box {
	return harness.StartBox(t, harness.BoxOptions{JSON: boxConfig(o), Env: e.s3.Env(e.prefix)})
}

type status struct {
	Routes int `json:"routes"`
	Spaces []struct {
		Host  string `json:"host"`
		State string `json:"state"`
		PID   int    `json:"pid"`
	} `json:"spaces"`
	Counters map[string]float64 `json:"counters"`
}

func getStatus(t *testing.T, b *harness.Box) status {
	t.Helper()
	var st status
	b.AdminJSON("GET", "/lchat/status", nil, 200, &st)
	return st
}

// space returns the state and PID of host ("" when the engine does not know it).
func space(t *testing.T, b *harness.Box, host string) (string, int) {
	for _, s := range getStatus(t, b).Spaces {
		if s.Host == host {
			return s.State, s.PID
		}
	}
	return "", 0
}

func createSpace(t *testing.T, b *harness.Box, host string) {
	t.Helper()
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "demo"}, http.StatusCreated, nil)
}

func do(t *testing.T, b *harness.Box, method, host, path, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, b.URL(host, path), rd)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := b.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s%s: %v", method, host, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func postMessage(t *testing.T, b *harness.Box, host, text string) {
	t.Helper()
	code, body := do(t, b, "POST", host, "/api/messages", fmt.Sprintf(`{"author":"test","text":%q}`, text))
	if code != http.StatusCreated {
		t.Fatalf("posting message: %d %s", code, body)
	}
}

func messages(t *testing.T, b *harness.Box, host string) string {
	t.Helper()
	code, body := do(t, b, "GET", host, "/api/messages", "")
	if code != 200 {
		t.Fatalf("GET /api/messages: %d %s", code, body)
	}
	return body
}

func readObject(t *testing.T, bkt bucket.Bucket, key string) ([]byte, string) {
	t.Helper()
	obj, err := bkt.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	defer obj.Body.Close()
	data, _ := io.ReadAll(obj.Body)
	return data, obj.ETag
}

// instanceStarts counts the process starts of host's instance, from the log the engine
// appends a line to before each start.
func instanceStarts(t *testing.T, b *harness.Box, host string) int {
	t.Helper()
	data, err := os.ReadFile(instanceLog(b, host))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "--- ") && strings.Contains(line, " starting ") {
			n++
		}
	}
	return n
}

func instanceLog(b *harness.Box, host string) string {
	return filepath.Join(b.Dir, "state", "spaces", host, "instance.log")
}

// bucketMessages reads the chat messages straight from the space's checkpoint in the
// bucket: the database blob the manifest names, opened on its own.
func bucketMessages(t *testing.T, bkt bucket.Bucket, host string) []string {
	t.Helper()
	// Restore the checkpoint the way a wake does, whatever the manifest's format.
	dir := t.TempDir()
	s := &lspace.Syncer{Bucket: bkt, Host: host, DataDir: filepath.Join(dir, "data"), WorkDir: filepath.Join(dir, "work")}
	if err := s.Load(context.Background()); err != nil {
		t.Fatalf("manifest of %s: %v", host, err)
	}
	if m, _ := s.Manifest(); m == nil {
		t.Fatalf("no manifest for %s", host)
	}
	if err := s.Restore(context.Background()); err != nil {
		t.Fatalf("restoring %s: %v", host, err)
	}
	p := filepath.Join(s.DataDir, "chat.db")
	if _, err := os.Stat(p); err != nil {
		m, _ := s.Manifest()
		t.Fatalf("manifest of %s names no chat.db: %+v", host, m.Files)
	}
	db, err := sql.Open("sqlite", p)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query("SELECT text FROM messages ORDER BY id")
	if err != nil {
		t.Fatalf("checkpointed chat.db of %s: %v", host, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		rows.Scan(&s)
		out = append(out, s)
	}
	return out
}

func TestLifecycle(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{Idle: "2s"})
	const host = "life.example.com"
	createSpace(t, b, host)

	if code, body := do(t, b, "GET", host, "/", ""); code != 200 || !strings.Contains(strings.ToLower(body), "<html") {
		t.Fatalf("GET /: %d %.200s", code, body)
	}
	postMessage(t, b, host, "hello from the lifecycle test")

	harness.WaitFor(t, 30*time.Second, "space asleep after idle", func() bool {
		st, pid := space(t, b, host)
		return st == "asleep" && pid == 0
	})
	manifest, _ := readObject(t, e.bkt, "spaces/"+host+"/manifest")
	var m struct {
		Generation int64 `json:"generation"`
		Files      []struct {
			Path string `json:"path"`
		} `json:"files"`
	}
	if err := json.Unmarshal(manifest, &m); err != nil || len(m.Files) == 0 {
		t.Fatalf("manifest in the bucket: %s (%v)", manifest, err)
	}
	page, err := e.bkt.List(context.Background(), "spaces/"+host+"/objs/", "")
	if err != nil || len(page.Objects) == 0 {
		t.Fatalf("no objects in the bucket: %+v %v", page, err)
	}
	if got := bucketMessages(t, e.bkt, host); !slices.Contains(got, "hello from the lifecycle test") {
		t.Fatalf("the checkpoint in the bucket lacks the message: %q", got)
	}
	lease, _ := readObject(t, e.bkt, "spaces/"+host+"/lease")
	if !strings.Contains(string(lease), `"released":true`) {
		t.Fatalf("lease after idle sleep: %s, want released", lease)
	}

	if got := messages(t, b, host); !strings.Contains(got, "hello from the lifecycle test") {
		t.Fatalf("message lost across sleep and wake: %s", got)
	}
	st := getStatus(t, b)
	if st.Counters["wakes"] != 2 || st.Counters["sleeps"] < 1 || instanceStarts(t, b, host) != 2 {
		t.Fatalf("counters after one sleep and two wakes: %v, %d process starts", st.Counters, instanceStarts(t, b, host))
	}
}

// herd sends 100 concurrent GET /api/messages to host and returns the status codes
// and how many bodies held want.
func herd(t *testing.T, b *harness.Box, host, want string) (map[int]int, int) {
	client := b.Client()
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	found := 0
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get(b.URL(host, "/api/messages"))
			code, has := 0, false
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				code, has = resp.StatusCode, strings.Contains(string(body), want)
			}
			mu.Lock()
			codes[code]++
			if has {
				found++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return codes, found
}

func TestConcurrentFirstRequests(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{})

	// A space never woken before: nothing to restore.
	const fresh = "herd.example.com"
	createSpace(t, b, fresh)
	if codes, _ := herd(t, b, fresh, ""); codes[200] != 100 {
		t.Fatalf("status codes of 100 concurrent first requests: %v, want all 200", codes)
	}
	if n := instanceStarts(t, b, fresh); n != 1 || getStatus(t, b).Counters["wakes"] != 1 {
		t.Fatalf("%d process starts, wakes %v; want exactly one", n, getStatus(t, b).Counters["wakes"])
	}

	// A sleeping space with state in the bucket: the wake restores it first.
	const sleeper = "herd2.example.com"
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": sleeper, "kind": "nap"}, http.StatusCreated, nil)
	postMessage(t, b, sleeper, "said before the herd")
	harness.WaitFor(t, 30*time.Second, "space asleep after idle", func() bool {
		st, pid := space(t, b, sleeper)
		return st == "asleep" && pid == 0
	})
	codes, found := herd(t, b, sleeper, "said before the herd")
	if codes[200] != 100 || found != 100 {
		t.Fatalf("100 concurrent first requests to a sleeping space: codes %v, %d bodies with the restored message; want 100 of each", codes, found)
	}
	if n := instanceStarts(t, b, sleeper); n != 2 {
		t.Fatalf("%d process starts of the sleeping space after the herd, want 2 (one before, one for the herd)", n)
	}
}

func TestForeignManifestFencesBox(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{Replication: "500ms"})
	const host = "fence.example.com"
	createSpace(t, b, host)
	postMessage(t, b, host, "first")
	key := "spaces/" + host + "/manifest"
	harness.WaitFor(t, 30*time.Second, "first checkpoint", func() bool {
		_, err := e.bkt.Head(context.Background(), key)
		return err == nil
	})

	// Another writer takes the space over behind the box's back.
	data, _ := readObject(t, e.bkt, key)
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m["generation"] = m["generation"].(float64) + 100
	m["written_by"] = "someone-else"
	foreign, _ := json.Marshal(m)
	if _, err := e.bkt.Put(context.Background(), key, strings.NewReader(string(foreign)), int64(len(foreign)), bucket.Cond{}); err != nil {
		t.Fatal(err)
	}
	postMessage(t, b, host, "second, after the takeover")

	_, pid := space(t, b, host)
	harness.WaitFor(t, 30*time.Second, "the box to stop the fenced instance", func() bool {
		st, p := space(t, b, host)
		return st != "awake" && p == 0 && syscall.Kill(pid, 0) != nil
	})
	if c := getStatus(t, b).Counters; c["fenced"] < 1 {
		t.Fatalf("fenced counter = %v", c["fenced"])
	}
	// The box never retries the write: the foreign state stays, even through a drain.
	if err := b.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if got, _ := readObject(t, e.bkt, key); string(got) != string(foreign) {
		t.Fatalf("foreign manifest overwritten:\nwant %s\ngot  %s", foreign, got)
	}
}

func TestCrashAndRecovery(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{})
	const host = "crash.example.com"
	createSpace(t, b, host)
	postMessage(t, b, host, "written before the crash")
	_, pid := space(t, b, host)
	if pid == 0 {
		t.Fatal("no PID for an awake space")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 30*time.Second, "crash detected", func() bool {
		st, p := space(t, b, host)
		return st != "awake" && p == 0
	})
	if c := getStatus(t, b).Counters; c["crashes"] != 1 {
		t.Fatalf("crashes = %v, want 1", c["crashes"])
	}
	if got := messages(t, b, host); !strings.Contains(got, "written before the crash") {
		t.Fatalf("message lost in crash: %s", got)
	}
	_, pid2 := space(t, b, host)
	if pid2 == 0 || pid2 == pid {
		t.Fatalf("after recovery pid = %d (crashed pid %d)", pid2, pid)
	}

	// Repeated crashes back off instead of looping: the third crash in a row is followed
	// by 503 with a Retry-After of at least the 2s backoff, then a wake once it passes.
	crashAndWait := func(pid int) {
		t.Helper()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		harness.WaitFor(t, 30*time.Second, "crash detected", func() bool {
			st, p := space(t, b, host)
			return st != "awake" && p == 0
		})
	}
	crashAndWait(pid2)
	var pid3 int
	harness.WaitFor(t, 30*time.Second, "wake after the first backoff", func() bool {
		code, _ := do(t, b, "GET", host, "/healthz", "")
		_, pid3 = space(t, b, host)
		return code == 200 && pid3 != 0
	})
	crashAndWait(pid3)
	resp, err := b.Client().Get(b.URL(host, "/healthz"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusServiceUnavailable || ra < 2 {
		t.Fatalf("request right after a third crash: %d Retry-After %q, want 503 with Retry-After >= 2",
			resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if c := getStatus(t, b).Counters; c["crashes"] != 3 {
		t.Fatalf("crashes = %v, want 3", c["crashes"])
	}
	harness.WaitFor(t, 30*time.Second, "wake after the backoff", func() bool {
		code, _ := do(t, b, "GET", host, "/healthz", "")
		return code == 200
	})
	if got := messages(t, b, host); !strings.Contains(got, "written before the crash") {
		t.Fatalf("message lost across repeated crashes: %s", got)
	}
}

func TestReloadKeepsInstances(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{})
	hosts := []string{"r1.example.com", "r2.example.com"}
	pids := map[string]int{}
	leases := map[string]string{}
	for _, h := range hosts {
		createSpace(t, b, h)
		postMessage(t, b, h, "before reload")
		_, pids[h] = space(t, b, h)
		info, err := e.bkt.Head(context.Background(), "spaces/"+h+"/lease")
		if err != nil {
			t.Fatal(err)
		}
		leases[h] = info.ETag
	}
	// An unrelated change: the scheduled-wake scan interval.
	if err := b.Reload(boxConfig(cfgOpts{WakeScan: "2s"}), true); err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		st, pid := space(t, b, h)
		if st != "awake" || pid != pids[h] {
			t.Fatalf("%s after reload: %s pid %d, want awake pid %d", h, st, pid, pids[h])
		}
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("%s instance %d gone after reload: %v", h, pid, err)
		}
		info, err := e.bkt.Head(context.Background(), "spaces/"+h+"/lease")
		if err != nil || info.ETag != leases[h] {
			t.Fatalf("%s lease changed by reload: %v %s -> %s", h, err, leases[h], info.ETag)
		}
		if got := messages(t, b, h); !strings.Contains(got, "before reload") {
			t.Fatalf("%s: %s", h, got)
		}
	}
	if c := getStatus(t, b).Counters; c["wakes"] != 2 || c["sleeps"] != 0 {
		t.Fatalf("counters after reload: %v", c)
	}
}

func TestSIGTERMDrains(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{Replication: "1h"}) // no periodic sync: only the drain saves
	const host = "drain.example.com"
	createSpace(t, b, host)
	postMessage(t, b, host, "saved by the drain")
	_, pid := space(t, b, host)
	if err := b.Stop(); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("instance %d still running after the box exited", pid)
	}
	lease, _ := readObject(t, e.bkt, "spaces/"+host+"/lease")
	var l struct {
		Released bool `json:"released"`
	}
	if err := json.Unmarshal(lease, &l); err != nil || !l.Released {
		t.Fatalf("lease not released after drain: %s", lease)
	}
	// A brand-new box on the same bucket restores the drained state.
	b2 := e.box(t, cfgOpts{Replication: "1h"})
	createSpace(t, b2, host)
	if got := messages(t, b2, host); !strings.Contains(got, "saved by the drain") {
		t.Fatalf("drained state missing on a new box: %s", got)
	}

	// `lchat-caddy stop` drains the same way.
	postMessage(t, b2, host, "saved by lchat-caddy stop")
	_, pid2 := space(t, b2, host)
	if out, err := b2.CLI("stop"); err != nil {
		t.Fatalf("lchat-caddy stop: %v %s", err, out)
	}
	harness.WaitFor(t, 2*time.Minute, "the box to exit after stop", b2.Exited)
	if err := syscall.Kill(pid2, 0); err == nil {
		t.Fatalf("instance %d still running after lchat-caddy stop", pid2)
	}
	lease, _ = readObject(t, e.bkt, "spaces/"+host+"/lease")
	if err := json.Unmarshal(lease, &l); err != nil || !l.Released {
		t.Fatalf("lease not released after lchat-caddy stop: %s", lease)
	}
	if got := bucketMessages(t, e.bkt, host); !slices.Contains(got, "saved by lchat-caddy stop") {
		t.Fatalf("checkpoint after lchat-caddy stop lacks the last message: %q", got)
	}
}

func TestScheduledWake(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{Idle: "1s", WakeScan: "500ms"})
	const host = "alarm.example.com"
	createSpace(t, b, host)
	at := time.Now().Add(6 * time.Second).UTC().Format(time.RFC3339)
	code, body := do(t, b, "POST", host, "/api/reminders", fmt.Sprintf(`{"at":%q,"text":"wake-up call"}`, at))
	if code != http.StatusCreated {
		t.Fatalf("posting reminder: %d %s", code, body)
	}
	harness.WaitFor(t, 30*time.Second, "space asleep before its wake time", func() bool {
		st, _ := space(t, b, host)
		return st == "asleep"
	})
	if _, err := e.bkt.Head(context.Background(), "wakes/"+host); err != nil {
		t.Fatalf("scheduled wake not recorded in the bucket: %v", err)
	}
	// No request from here on until the box has woken the space by itself and its POST
	// was answered 2xx: only then is the record deleted.
	harness.WaitFor(t, 60*time.Second, "the scheduled wake delivered", func() bool {
		_, err := e.bkt.Head(context.Background(), "wakes/"+host)
		return errors.Is(err, bucket.ErrNotFound)
	})
	if w := getStatus(t, b).Counters["wakes"]; w != 2 {
		t.Fatalf("wakes = %v before any request, want 2 (the scheduled one)", w)
	}
	// The demo logs each wake POST with its X-Lchat-Wake-Reason.
	if data, _ := os.ReadFile(instanceLog(b, host)); !strings.Contains(string(data), `"reason":"scheduled"`) {
		t.Fatalf("instance never saw a POST with X-Lchat-Wake-Reason: scheduled; its log:\n%s", data)
	}
	harness.WaitFor(t, 30*time.Second, "the reminder delivered", func() bool {
		return strings.Contains(messages(t, b, host), "wake-up call")
	})
}

func TestOperatorSurface(t *testing.T) {
	e := newEnv(t)
	b := e.box(t, cfgOpts{})
	const secret = "s3cr3t-v4lue-never-shown"

	// A mistyped host gets a page saying so, not a browser's own error page.
	if code, page := do(t, b, "GET", "nobody.example.com", "/", ""); code != http.StatusNotFound ||
		page != "404 Not Found: nobody.example.com is not a space on this server.\n" {
		t.Fatalf("unknown host: %d %q, want 404 with its page", code, page)
	}

	for body, want := range map[string]string{
		`{"host": "a.example.com", "kind": "demo"`:                         "decoding",
		`{"host": "a.example.com", "kind": "demo", "colour": "blue"}`:      "unknown field",
		`{"host": "A.example.com", "kind": "demo"}`:                        "lowercase",
		`{"host": "a.example.com:443", "kind": "demo"}`:                    "port",
		`{"host": "*.example.com", "kind": "demo"}`:                        "wildcard",
		`{"host": "a.example.com", "kind": "nope"}`:                        `is not configured on this box`,
		`{"host": "a.example.com", "kind": "demo", "env": {"PATH": "/x"}}`: "env PATH is not allowed",
	} {
		code, data, err := b.Admin("POST", "/lchat/routes", body)
		if err != nil || code != http.StatusBadRequest || !strings.Contains(string(data), want) {
			t.Errorf("POST %s: %d %s, want 400 mentioning %q", body, code, data, want)
		}
	}
	var page struct {
		Routes []map[string]any `json:"routes"`
	}
	b.AdminJSON("GET", "/lchat/routes", nil, 200, &page)
	if len(page.Routes) != 0 {
		t.Fatalf("bad input changed the registry: %+v", page.Routes)
	}

	out, err := b.CLI("add-instance", "cli.example.com", "--kind", "nope")
	if err == nil || !strings.Contains(out, "not configured") {
		t.Fatalf("add-instance of an unconfigured kind: %v %s", err, out)
	}
	out, err = b.CLI("add-instance", "cli.example.com", "--kind", "demo", "--version", "7", "--env", "DEMO_SECRET="+secret)
	if err != nil || strings.Contains(out, secret) || !strings.Contains(out, "DEMO_SECRET") {
		t.Fatalf("add-instance: %v\n%s", err, out)
	}
	if code, _, _ := b.Admin("POST", "/lchat/routes", map[string]any{"host": "cli.example.com", "kind": "demo"}); code != http.StatusConflict {
		t.Fatalf("duplicate create: %d, want 409", code)
	}
	for _, path := range []string{"/lchat/routes", "/lchat/routes/cli.example.com", "/lchat/status"} {
		_, data, _ := b.Admin("GET", path, nil)
		if strings.Contains(string(data), secret) {
			t.Fatalf("GET %s leaks an env value: %s", path, data)
		}
	}
	if code, _ := do(t, b, "GET", "cli.example.com", "/healthz", ""); code != 200 {
		t.Fatalf("space created by the CLI: %d", code)
	}

	// Bad input on the other endpoints: 4xx with a message, and nothing changes.
	before, beforeBody, _ := b.Admin("GET", "/lchat/routes/cli.example.com", nil)
	for _, c := range []struct {
		method, path string
		body         any
		want         string
	}{
		{"POST", "/lchat/routes/cli.example.com/hibernate", `{"hibernate": fals`, "decoding"},
		{"POST", "/lchat/routes/cli.example.com/hibernate", `{}`, "hibernate"},
		{"POST", "/lchat/routes/cli.example.com/hibernate", `{"hibernate": false}`, "upstream"},
		{"POST", "/lchat/routes/cli.example.com/hibernate", `{"hibernate": true, "kind": "x"}`, "unknown field"},
		{"POST", "/lchat/routes/CLI.example.com/hibernate", `{"hibernate": false, "upstream": "127.0.0.1:1"}`, "lowercase"},
		{"DELETE", "/lchat/routes/cli.example.com:443", nil, "port"},
		{"GET", "/lchat/routes?limit=0", nil, "limit"},
		{"GET", "/lchat/routes?limit=many", nil, "limit"},
	} {
		code, data, err := b.Admin(c.method, c.path, c.body)
		if err != nil || code < 400 || code > 499 || !strings.Contains(string(data), c.want) {
			t.Errorf("%s %s %v: %d %s, want 4xx mentioning %q", c.method, c.path, c.body, code, data, c.want)
		}
	}
	if _, after, _ := b.Admin("GET", "/lchat/routes/cli.example.com", nil); before != 200 || string(after) != string(beforeBody) {
		t.Fatalf("bad input changed the route:\nbefore %s\nafter  %s", beforeBody, after)
	}
	if st, _ := space(t, b, "cli.example.com"); st != "awake" {
		t.Fatalf("bad input changed the space: %s, want awake", st)
	}

	// Paged listing.
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": "page1.example.com", "kind": "demo"}, http.StatusCreated, nil)
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": "page2.example.com", "kind": "demo"}, http.StatusCreated, nil)
	var seen []string
	for after, pages := "", 0; ; pages++ {
		var p struct {
			Routes []struct {
				Host string `json:"host"`
			} `json:"routes"`
			Next string `json:"next"`
		}
		b.AdminJSON("GET", "/lchat/routes?limit=2&after="+after, nil, 200, &p)
		if len(p.Routes) > 2 || pages > 3 {
			t.Fatalf("page of %d routes with limit 2 (page %d)", len(p.Routes), pages)
		}
		for _, r := range p.Routes {
			seen = append(seen, r.Host)
		}
		if p.Next == "" {
			break
		}
		after = p.Next
	}
	if want := []string{"cli.example.com", "page1.example.com", "page2.example.com"}; !slices.Equal(seen, want) {
		t.Fatalf("paged listing = %q, want %q", seen, want)
	}
	for _, h := range []string{"page1.example.com", "page2.example.com"} {
		b.AdminJSON("DELETE", "/lchat/routes/"+h, nil, 200, nil)
	}
	out, err = b.CLI("routes")
	if err != nil || !strings.Contains(out, "cli.example.com") || strings.Contains(out, secret) {
		t.Fatalf("routes: %v\n%s", err, out)
	}
	if strings.Contains(b.Logs(), secret) {
		t.Fatal("the box logged an env value")
	}
	if strings.Contains(b.Logs(), e.s3.SecretKey) {
		t.Fatal("the box logged the S3 secret key")
	}

	// A live route, by flipping hibernation off toward a plain upstream.
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "live upstream saw host %s", r.Host)
	}))
	defer live.Close()
	if out, err := b.CLI("hibernate", "cli.example.com", "--off"); err == nil {
		t.Fatalf("hibernate --off without an upstream succeeded: %s", out)
	}
	if out, err := b.CLI("hibernate", "cli.example.com", "--off", "--upstream", strings.TrimPrefix(live.URL, "http://")); err != nil {
		t.Fatalf("hibernate --off: %v %s", err, out)
	}
	if code, body := do(t, b, "GET", "cli.example.com", "/", ""); code != 200 || !strings.HasPrefix(body, "live upstream saw host cli.example.com") {
		t.Fatalf("live route: %d %s", code, body)
	}
	if st, pid := space(t, b, "cli.example.com"); st == "awake" || pid != 0 {
		t.Fatalf("space still awake after hibernate --off: %s %d", st, pid)
	}
	if out, err := b.CLI("hibernate", "cli.example.com", "--on"); err != nil {
		t.Fatalf("hibernate --on: %v %s", err, out)
	}
	if code, _ := do(t, b, "GET", "cli.example.com", "/healthz", ""); code != 200 {
		t.Fatalf("after hibernate --on: %d", code)
	}

	// Not ready in time: 503 with Retry-After, never 502.
	b.AdminJSON("POST", "/lchat/routes", map[string]any{"host": "stuck.example.com", "kind": "stuck"}, http.StatusCreated, nil)
	req, _ := http.NewRequest("GET", b.URL("stuck.example.com", "/"), nil)
	resp, err := b.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("readiness timeout: %d Retry-After %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	if out, err := b.CLI("remove", "cli.example.com"); err != nil {
		t.Fatalf("remove: %v %s", err, out)
	}
	if code, _ := do(t, b, "GET", "cli.example.com", "/", ""); code != http.StatusNotFound {
		t.Fatalf("removed host: %d, want 404", code)
	}
	if code, _, _ := b.Admin("GET", "/lchat/routes/cli.example.com", nil); code != http.StatusNotFound {
		t.Fatalf("removed route still listed: %d", code)
	}
}
