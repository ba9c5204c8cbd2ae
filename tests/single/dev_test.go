package single

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket/filebucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// devRun is one `lchat-caddy dev` process.
type devRun struct {
	cmd         *exec.Cmd
	done        chan error
	out         chan string // stdout lines
	listen, adm string
	// banner is what dev printed on stdout up to its last banner line; stderr its log.
	banner []string
	stderr *harness.SyncBuffer
}

// devOpts says how a test runs `lchat-caddy dev`.
type devOpts struct {
	// bin is the command as a person types it (default: the built binary's path); cwd
	// the directory it runs in (default dir).
	bin, cwd string
	// devDir is --dir (default dir/lchat-dev).
	devDir string
}

// startDev runs `lchat-caddy dev` in dir, as the README tells a newcomer to, and waits
// for the URLs it prints.
func startDev(t *testing.T, dir, home string) *devRun {
	t.Helper()
	return startDevWith(t, dir, home, devOpts{})
}

func startDevWith(t *testing.T, dir, home string, o devOpts) *devRun {
	t.Helper()
	if o.bin == "" {
		o.bin = harness.Binary(t)
	}
	if o.cwd == "" {
		o.cwd = dir
	}
	if o.devDir == "" {
		o.devDir = filepath.Join(dir, "lchat-dev")
	}
	d := &devRun{listen: harness.FreeAddr(t, "127.0.0.1"), adm: harness.FreeAddr(t, "127.0.0.1"), done: make(chan error, 1),
		out: make(chan string, 1024), stderr: new(harness.SyncBuffer)}
	d.cmd = exec.Command(o.bin, "dev", "--dir", o.devDir, "--listen", d.listen, "--admin", d.adm)
	d.cmd.Dir = o.cwd
	env := []string{"HOME=" + home, "XDG_DATA_HOME=" + filepath.Join(home, "data"), "XDG_CONFIG_HOME=" + filepath.Join(home, "config")}
	for _, kv := range os.Environ() {
		if n, _, _ := strings.Cut(kv, "="); n == "PATH" || n == "TMPDIR" {
			env = append(env, kv)
		}
	}
	d.cmd.Env = env
	stdout, _ := d.cmd.StdoutPipe()
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case d.out <- sc.Text():
			default:
			}
		}
		d.done <- d.cmd.Wait()
	}()
	t.Cleanup(func() { d.cmd.Process.Kill() })
	deadline := time.After(60 * time.Second)
	for {
		select {
		case line := <-d.out:
			d.banner = append(d.banner, line)
			if strings.Contains(line, "demo space:") && !strings.Contains(line, "http://demo.localhost:") {
				t.Fatalf("dev printed %q, want the demo space URL", line)
			}
			if strings.HasPrefix(line, "Ctrl-C saves") {
				return d
			}
		case err := <-d.done:
			t.Fatalf("lchat-caddy dev exited during start-up: %v\n%s", err, strings.Join(d.banner, "\n"))
		case <-deadline:
			t.Fatalf("lchat-caddy dev printed no URLs within 60s:\n%s", strings.Join(d.banner, "\n"))
		}
	}
}

// bannerCommand is the command dev printed after label ("Add a space:"), as fields.
func (d *devRun) bannerCommand(t *testing.T, label string) []string {
	t.Helper()
	for _, l := range d.banner {
		if rest, ok := strings.CutPrefix(l, label); ok {
			return strings.Fields(rest)
		}
	}
	t.Fatalf("dev printed no %q line:\n%s", label, strings.Join(d.banner, "\n"))
	return nil
}

func (d *devRun) do(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+d.listen+path, strings.NewReader(body))
	req.Host = "demo.localhost"
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// interrupt is Ctrl-C: the process must drain and exit cleanly.
func (d *devRun) interrupt(t *testing.T) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("lchat-caddy dev after Ctrl-C: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("lchat-caddy dev did not exit within 2 minutes of Ctrl-C")
	}
}

// `lchat-caddy dev`: one command, no setup; the demo space exists on first run, serves
// its page, and Ctrl-C saves it to the local bucket so the next run has it back. A run
// that goes well writes nothing on stderr at the default level.
func TestDevCommand(t *testing.T) {
	dir, home := t.TempDir(), t.TempDir()
	d := startDev(t, dir, home)
	if code, body := d.do(t, "GET", "/", ""); code != 200 || !strings.Contains(strings.ToLower(body), "<html") {
		t.Fatalf("GET / on the demo space: %d %.200s", code, body)
	}
	if code, body := d.do(t, "POST", "/api/messages", `{"author":"dev","text":"kept across dev runs"}`); code != http.StatusCreated {
		t.Fatalf("posting: %d %s", code, body)
	}
	// Which lchat build runs, beside Caddy's: in the admin API's status and the console's
	// fleet (its VERSION column).
	var st struct {
		Version string `json:"version"`
	}
	getJSON(t, "http://"+d.adm+"/lchat/status", "", &st)
	var fleet struct {
		Boxes []struct {
			Version string `json:"version"`
		} `json:"boxes"`
	}
	getJSON(t, "http://"+d.listen+"/api/fleet", "console.localhost", &fleet)
	consoleVersion := ""
	if len(fleet.Boxes) > 0 {
		consoleVersion = fleet.Boxes[0].Version
	}
	for where, v := range map[string]string{"/lchat/status": st.Version, "the console's fleet": consoleVersion} {
		if !strings.HasPrefix(v, "lchat-caddy ") || !strings.Contains(v, "(Caddy v2.") {
			t.Errorf("version in %s: %q, want \"lchat-caddy <build> (Caddy v2.…)\"", where, v)
		}
	}
	d.interrupt(t)
	// At the default level a run that went well logs nothing: not its start, not the
	// wake, not Ctrl-C (Caddy's "exiting; byeee!! 👋" is a warning).
	if log := d.stderr.String(); log != "" {
		t.Errorf("dev's stderr at the default level, after a start, a wake and Ctrl-C:\n%s", log)
	}

	// Ctrl-C drained: the local bucket holds the space, its lease released.
	fb, err := filebucket.New(filepath.Join(dir, "lchat-dev", "bucket"))
	if err != nil {
		t.Fatal(err)
	}
	if got := bucketMessages(t, fb, "demo.localhost"); len(got) == 0 || got[len(got)-1] != "kept across dev runs" {
		t.Fatalf("local bucket after Ctrl-C holds %q", got)
	}
	obj, err := fb.Get(context.Background(), "spaces/demo.localhost/lease")
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		Released bool `json:"released"`
	}
	json.NewDecoder(obj.Body).Decode(&l)
	obj.Body.Close()
	if !l.Released {
		t.Fatal("lease not released by Ctrl-C")
	}

	// The second run finds its route and state; the CLI talks to it.
	d = startDev(t, dir, home)
	if code, body := d.do(t, "GET", "/api/messages", ""); code != 200 || !strings.Contains(body, "kept across dev runs") {
		t.Fatalf("second run: %d %s", code, body)
	}
	out, err := exec.Command(harness.Binary(t), "routes", "--address", d.adm).CombinedOutput()
	if err != nil || strings.Count(string(out), "demo.localhost") != 1 {
		t.Fatalf("routes on the second run: %v\n%s", err, out)
	}
	if out, err := exec.Command(harness.Binary(t), "status", "--address", d.adm).CombinedOutput(); err != nil || !strings.Contains(string(out), "demo.localhost") {
		t.Fatalf("status on the second run: %v\n%s", err, out)
	}
	d.interrupt(t)
	// Nor do the CLI's calls to the admin API (its access log is at debug).
	if log := d.stderr.String(); log != "" {
		t.Errorf("dev's stderr at the default level, after a start, routes, status and Ctrl-C:\n%s", log)
	}
}

// getJSON decodes the 200 answer of GET url, sent with host as its Host when not "".
func getJSON(t *testing.T, url, host string, v any) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, data)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
