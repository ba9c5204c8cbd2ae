// Package console tests the operator's console (http.handlers.lchat_console) in a real
// browser: Debian's Chromium driven by chromedp, against a real `lchat-caddy dev` running
// the demo space. Screenshots go to tests/console/artifacts/<test> (or $LCHAT_ARTIFACTS).
package console

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// dev is one `lchat-caddy dev` process.
type dev struct {
	listen, port, admin string
	printed             []string
}

// startDev runs `lchat-caddy dev` as the README says, with free ports and a short idle
// timeout, and returns once it printed its URLs.
func startDev(t *testing.T, idle time.Duration) *dev {
	t.Helper()
	dir, home := t.TempDir(), t.TempDir()
	d := &dev{listen: harness.FreeAddr(t, "127.0.0.1"), admin: harness.FreeAddr(t, "127.0.0.1")}
	_, d.port, _ = net.SplitHostPort(d.listen)
	cmd := exec.Command(harness.Binary(t), "dev", "--dir", filepath.Join(dir, "state"), "--listen", d.listen,
		"--admin", d.admin, "--idle-timeout", idle.String())
	cmd.Dir = dir
	env := []string{"HOME=" + home, "XDG_DATA_HOME=" + filepath.Join(home, "data"), "XDG_CONFIG_HOME=" + filepath.Join(home, "config")}
	for _, kv := range os.Environ() {
		if n, _, _ := strings.Cut(kv, "="); n == "PATH" || n == "TMPDIR" {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	stdout, _ := cmd.StdoutPipe()
	logf, err := os.Create(filepath.Join(dir, "dev.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
		}
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("dev log (last 4000 bytes):\n%s", tail(string(b), 4000))
		}
	})
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("lchat-caddy dev exited during start-up:\n%s", strings.Join(d.printed, "\n"))
			}
			d.printed = append(d.printed, line)
			if strings.Contains(line, "admin API:") {
				go func() {
					for range lines {
					}
				}()
				return d
			}
		case <-deadline:
			t.Fatalf("lchat-caddy dev printed no URLs within 60s:\n%s", strings.Join(d.printed, "\n"))
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// request sends one request to host through the dev server.
func (d *dev) request(t *testing.T, ctx context.Context, host, path string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+d.listen+path, nil)
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s%s: %v", host, path, err)
	}
	return resp
}

func (d *dev) get(t *testing.T, host, path string) (int, string) {
	t.Helper()
	resp := d.request(t, context.Background(), host, path)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// browser wraps a chromedp tab with the test's failure handling and screenshots.
type browser struct {
	t   *testing.T
	ctx context.Context
	art string
	n   int
}

func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.shot("failed-" + strings.ReplaceAll(what, " ", "-"))
		b.t.Fatalf("%s: %v", what, err)
	}
}

// wait polls a JavaScript predicate until it is true. It evaluates afresh each time, so
// it survives the navigations a form submit or a redirect makes.
func (b *browser) wait(what, predicate string, timeout time.Duration) {
	b.t.Helper()
	var last error
	harness.WaitFor(b.t, timeout, what+" ("+predicate+")", func() bool {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		defer cancel()
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("(() => { try { return !!("+predicate+") } catch (e) { return false } })()"))
		last = err
		return err == nil && ok
	}, func() string {
		// Asked only on a failure: the screenshot shows the page that never got there.
		b.shot("failed-" + strings.ReplaceAll(what, " ", "-"))
		return fmt.Sprintf("last error: %v", last)
	})
}

func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// shot keeps a full-page screenshot as a test artifact.
func (b *browser) shot(name string) {
	b.n++
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	p := filepath.Join(b.art, fmt.Sprintf("%02d-%s.png", b.n, name))
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Errorf("writing %s: %v", p, err)
	}
	b.t.Logf("screenshot: %s", p)
}

func setScripts(on bool) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: !on})
		return chromedp.Void{}, err
	}
}

// stateOf is the JavaScript for the state cell of a host's row in the spaces table.
func stateOf(host string) string {
	return fmt.Sprintf(`(document.querySelector('#spaces-table tr[data-host="%s"] td.state') || {}).textContent`, host)
}

// TestConsoleInBrowser is the operator's first look: `lchat-caddy dev` prints the console
// URL; the console lists the demo space (without JavaScript too); it updates live when the
// space wakes and sleeps; the basics work from the keyboard and carry labels; the space's
// page shows its wake by phase; and the hibernate action runs only after confirmation.
func TestConsoleInBrowser(t *testing.T) {
	d := startDev(t, 5*time.Second)
	consoleURL := "http://console.localhost:" + d.port + "/"
	if !strings.Contains(strings.Join(d.printed, "\n"), "console:      "+consoleURL) {
		t.Fatalf("dev did not print the console URL %s:\n%s", consoleURL, strings.Join(d.printed, "\n"))
	}
	b := &browser{t: t, ctx: harness.Browser(t), art: harness.ArtifactDir(t, "console")}
	const demo = "demo.localhost"

	// Without JavaScript the tables are all there.
	b.do("load without scripts", setScripts(false), chromedp.Navigate(consoleURL))
	if got := eval[string](b, stateOf(demo)); strings.TrimSpace(got) != "asleep" {
		t.Fatalf("without scripts: demo row state %q, want asleep", got)
	}
	if n := eval[int](b, `document.querySelectorAll('table.fleet tbody tr').length`); n != 1 {
		t.Fatalf("without scripts: %d fleet rows, want this box", n)
	}
	b.shot("no-javascript")

	b.do("load", setScripts(true), chromedp.Navigate(consoleURL))
	b.wait("live stream", `document.getElementById('live').textContent === 'live'`, 20*time.Second)
	b.shot("loaded")

	// A wake shows up without a reload: the row turns awake and the event list says so.
	if code, _ := d.get(t, demo, "/"); code != 200 {
		t.Fatalf("GET demo: %d", code)
	}
	b.wait("demo awake", stateOf(demo)+`.trim() === 'awake'`, 20*time.Second)
	b.wait("wake event", `[...document.querySelectorAll('#event-list .ev-wake')].some(li => li.textContent.includes('demo.localhost') && li.textContent.includes('ready'))`, 20*time.Second)
	if got := eval[string](b, `document.querySelector('#spaces-table tr[data-host="demo.localhost"] td.awake-on').textContent`); strings.TrimSpace(got) == "–" {
		t.Errorf("awake on: %q, want this box", got)
	}
	b.shot("awake")

	// The idle timeout sleeps it; the page follows.
	b.wait("demo asleep", stateOf(demo)+`.trim() === 'asleep'`, 40*time.Second)
	b.wait("sleep event", `[...document.querySelectorAll('#event-list .ev-sleep')].some(li => li.textContent.includes('idle'))`, 20*time.Second)
	b.wait("checkpoint event", `document.querySelector('#event-list .ev-checkpoint') !== null`, 20*time.Second)
	b.wait("latency chart counts the wake", `document.querySelector('#chart-latency desc').textContent.startsWith('1 wakes')`, 60*time.Second)
	b.wait("awake chart back at zero", `document.querySelector('#chart-awake desc').textContent.includes('awake spaces now 0')`, 45*time.Second)
	b.shot("asleep")

	// Keyboard: the first Tab reaches the skip link, Enter moves focus to the content, and
	// the search field is reachable by Tab and submits with Enter.
	b.do("reload", chromedp.Navigate(consoleURL))
	b.do("tab", chromedp.KeyEvent("\t"))
	if got := eval[string](b, `document.activeElement.textContent`); got != "Skip to content" {
		t.Fatalf("first Tab focuses %q, want the skip link", got)
	}
	b.do("enter", chromedp.KeyEvent("\r"))
	b.wait("focus on main", `document.activeElement.id === 'main'`, 5*time.Second)
	for i := 0; i < 15 && eval[string](b, `document.activeElement.id`) != "q"; i++ {
		b.do("tab", chromedp.KeyEvent("\t"))
	}
	if eval[string](b, `document.activeElement.id`) != "q" {
		t.Fatal("Tab never reached the search field")
	}
	b.do("type search", chromedp.KeyEvent("demo\r"))
	b.wait("search results", `location.search === '?q=demo' && document.querySelector('#spaces-table caption').textContent.includes('matching “demo”')`, 10*time.Second)
	b.shot("search-by-keyboard")

	// Labels: every form control has an accessible name; every table a caption; every
	// chart a title and a description.
	unlabelled := eval[[]string](b, `[...document.querySelectorAll('input:not([type=hidden]), button, select, textarea')]
		.filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !(el.tagName === 'BUTTON' && el.textContent.trim()))
		.map(el => el.outerHTML)`)
	if len(unlabelled) > 0 {
		t.Errorf("controls without a label: %q", unlabelled)
	}
	if n := eval[int](b, `[...document.querySelectorAll('table')].filter(t => !t.caption).length`); n != 0 {
		t.Errorf("%d tables without a caption", n)
	}
	if n := eval[int](b, `[...document.querySelectorAll('svg.chart')].filter(s => s.getAttribute('role') !== 'img' || !s.querySelector('title') || !s.querySelector('desc')).length`); n != 0 {
		t.Errorf("%d charts without role=img, title and desc", n)
	}
	if n := eval[int](b, `document.querySelectorAll('svg.chart').length`); n < 3 {
		t.Errorf("%d charts, want latency, requests and awake", n)
	}

	// Wake the space again and keep it busy with an open stream; the space page shows the
	// wake by phase; hibernating it from the console needs a confirmation.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream := d.request(t, ctx, demo, "/api/events")
	defer stream.Body.Close()
	b.do("open space page", chromedp.Navigate(consoleURL+"space/"+demo))
	b.wait("space awake", `document.querySelector('.facts .st').textContent === 'awake'`, 20*time.Second)
	if n := eval[int](b, `document.querySelectorAll('table.wakes tbody tr').length`); n < 1 {
		t.Fatal("space page lists no wake")
	}
	if got := eval[string](b, `document.querySelector('table.wakes tbody tr').textContent`); !strings.Contains(got, "ms") || !strings.Contains(got, "ok") {
		t.Fatalf("wake row %q, want phase timings", got)
	}
	if got := eval[string](b, `document.querySelector('dl.stored').textContent`); !regexp.MustCompile(`Generation[1-9]`).MatchString(got) || !strings.Contains(got, "KiB") {
		t.Errorf("space page's bucket state %q, want the checkpoint's generation and size", got)
	}
	// Names and actions match the box: the checkpoint's writer is this box by the name
	// the fleet table gives it, the footer says the actions are on, and relocate is not
	// offered without a mesh.
	if got, name := eval[string](b, `document.querySelector('dl.stored').textContent`), d.boxName(t); !strings.Contains(got, "ago by "+name) {
		t.Errorf("space page's bucket state %q, want its last checkpoint by %s", got, name)
	}
	if got := eval[string](b, `document.querySelector('footer').textContent`); !strings.HasPrefix(got, "Actions are on in lchat_console") {
		t.Errorf("footer %q, want it to say the actions are on", got)
	}
	if eval[bool](b, `document.querySelector('form[action$="actions/relocate"]') !== null`) {
		t.Error("relocate offered on a box without a mesh")
	}
	b.shot("space-page")
	b.do("ask to hibernate", chromedp.Click(chromedp.CSS(`form[action$="actions/hibernate"] button`)))
	b.wait("confirmation page", `document.querySelector('h1') && document.querySelector('h1').textContent.startsWith('Confirm')`, 10*time.Second)
	if got := eval[string](b, stateOfSpacePageless()); got != "" {
		t.Fatalf("confirmation page shows a state %q; nothing should have happened yet", got)
	}
	if code, body := d.get(t, "console.localhost", "/api/spaces?q=demo"); code != 200 || !strings.Contains(body, `"state":"awake"`) {
		t.Fatalf("before confirming, the space must still be awake: %d %s", code, body)
	}
	b.shot("confirm")
	b.do("confirm", chromedp.SendKeys(chromedp.CSS("#confirm"), demo+"\r"))
	b.wait("hibernated", `location.pathname.endsWith('/space/demo.localhost') && document.querySelector('.notice').textContent.startsWith('Hibernated') && document.querySelector('.facts .st').textContent === 'asleep'`, 30*time.Second)
	b.shot("hibernated")

	// The same wakes and checkpoints are in the metrics, by phase.
	resp, err := http.Get("http://" + d.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`lchat_wake_phase_seconds_count{phase="lease"} 2`, `lchat_wake_phase_seconds_count{phase="restore"} 2`,
		`lchat_wake_phase_seconds_count{phase="start"} 2`, `lchat_wake_phase_seconds_count{phase="ready"} 2`,
		`lchat_wake_seconds_count{result="ok"} 2`, `lchat_checkpoint_seconds_count{result="ok"}`, `lchat_checkpoint_bytes_count`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// boxName is the name the console's fleet table gives the dev box.
func (d *dev) boxName(t *testing.T) string {
	t.Helper()
	_, page := d.get(t, "console.localhost", "/")
	m := regexp.MustCompile(`<table class="grid fleet">[\s\S]*?<th scope="row">([^<]+?) <span class="tag">this box`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no box in the console's fleet table:\n%s", page)
	}
	return m[1]
}

// stateOfSpacePageless is the state cell of a page without a spaces table: empty.
func stateOfSpacePageless() string {
	return `(document.querySelector('.facts .st') || {textContent: ''}).textContent`
}
