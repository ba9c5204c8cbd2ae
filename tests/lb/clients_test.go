package lb

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"
)

// clients reach the spaces through the balancer only, from their own loopback addresses.
type clients struct {
	t      *testing.T
	lbAddr string
	// writer sends each request on a new connection: a keep-alive connection a stopping
	// box closes while a POST is on its way fails that POST whatever the balancer does
	// (a browser retries it; Go's client does not retry a POST), which is not what this
	// measures.
	writer *http.Client
	reader *http.Client
}

func dialFrom(src, to string) func(ctx context.Context, _, _ string) (net.Conn, error) {
	return func(ctx context.Context, _, _ string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
		return d.DialContext(ctx, "tcp", to)
	}
}

func newClients(t *testing.T, lbAddr string) *clients {
	return &clients{t: t, lbAddr: lbAddr,
		writer: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DialContext: dialFrom(writerIP, lbAddr), DisableKeepAlives: true}},
		reader: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DialContext: dialFrom(writerIP, lbAddr), DisableKeepAlives: true}},
	}
}

func (c *clients) get(host, path string) (int, string, error) {
	resp, err := c.reader.Get("http://" + host + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// texts reads every message of host's room, page by page.
func (c *clients) texts(host string) (map[string]bool, error) {
	out := map[string]bool{}
	after := int64(0)
	for {
		code, body, err := c.get(host, fmt.Sprintf("/api/messages?after=%d&limit=1000", after))
		if err != nil || code != 200 {
			return nil, fmt.Errorf("%d %v %.200s", code, err, body)
		}
		var msgs []struct {
			ID   int64  `json:"id"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal([]byte(body), &msgs); err != nil {
			return nil, err
		}
		if len(msgs) == 0 {
			return out, nil
		}
		for _, m := range msgs {
			out[m.Text] = true
			after = max(after, m.ID)
		}
	}
}

// load is the clients at work: per space, a writer posting messages and a holder keeping
// a WebSocket open (reopened after each close).
type load struct {
	stopping atomic.Bool
	stopCh   chan struct{}
	wg       sync.WaitGroup
	r        *results
}

// clientPause is the clients' own pace and their wait after a retryable 503 (what a
// client does, not a wait for a condition of the test).
const clientPause = 100 * time.Millisecond

func (c *clients) start(hosts []string) *load {
	l := &load{stopCh: make(chan struct{}), r: &results{acked: map[string][]string{}}}
	c.writeMore(l, hosts)
	c.holdMore(l, hosts)
	return l
}

// writeMore starts a writer per host.
func (c *clients) writeMore(l *load, hosts []string) {
	for _, h := range hosts {
		l.wg.Add(1)
		go func() { defer l.wg.Done(); c.write(l, h) }()
	}
}

// holdMore opens one more held WebSocket per host (reopened after each close): opened
// after a scale-out, some land on the new boxes, and the scale-in closes them.
func (c *clients) holdMore(l *load, hosts []string) {
	for _, h := range hosts {
		l.wg.Add(1)
		go func() { defer l.wg.Done(); c.hold(l, h) }()
	}
}

func (l *load) stop() *results {
	l.stopping.Store(true)
	close(l.stopCh)
	l.wg.Wait()
	return l.r
}

func (l *load) pause() bool {
	select {
	case <-l.stopCh:
		return false
	case <-time.After(clientPause):
		return true
	}
}

func (c *clients) write(l *load, host string) {
	for i := 0; !l.stopping.Load(); i++ {
		text := fmt.Sprintf("%s-%d", host, i)
		body := fmt.Sprintf(`{"author":"lb","text":%q}`, text)
		req, _ := http.NewRequest("POST", "http://"+host+"/api/messages", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.writer.Do(req)
		switch {
		case err != nil:
			l.r.fail("POST %s: %v", text, err)
		default:
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusCreated:
				l.r.mu.Lock()
				l.r.acked[host] = append(l.r.acked[host], text)
				l.r.mu.Unlock()
			case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
				l.r.mu.Lock()
				l.r.retryable++
				l.r.mu.Unlock()
			default:
				l.r.fail("POST %s: %d %.200s", text, resp.StatusCode, b)
			}
		}
		if !l.pause() {
			return
		}
	}
}

// hold keeps a WebSocket to host's room open through the balancer, held by whichever box
// the balancer picked: a close with 1012 (the box is going away) is reopened, as the
// room's page does; any other close, or a connection dropped without a close, is a
// failure.
func (c *clients) hold(l *load, host string) {
	d := ws.Dialer{NetDial: dialFrom(holderIP, c.lbAddr), Timeout: 30 * time.Second}
	for !l.stopping.Load() {
		conn, br, _, err := d.Dial(context.Background(), "ws://"+host+"/api/ws")
		var se ws.StatusError
		switch {
		case err != nil && errors.As(err, &se) && int(se) == http.StatusServiceUnavailable:
			l.r.mu.Lock()
			l.r.wsRetryable++
			l.r.mu.Unlock()
		case err != nil && !l.stopping.Load():
			l.r.fail("WebSocket to %s: %v", host, err)
		case err == nil:
			l.r.mu.Lock()
			l.r.wsOpened++
			l.r.mu.Unlock()
			c.readHeld(l, host, conn, br)
			continue
		}
		if !l.pause() {
			return
		}
	}
}

func (c *clients) readHeld(l *load, host string, conn net.Conn, br *bufio.Reader) {
	defer conn.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-l.stopCh:
			conn.Close()
		case <-done:
		}
	}()
	rd := io.Reader(conn)
	if br != nil {
		rd = br // the handshake's reader, holding what came with the answer
	}
	for {
		f, err := ws.ReadFrame(rd)
		if err != nil {
			if !l.stopping.Load() {
				l.r.fail("WebSocket to %s dropped without a close: %v", host, err)
			}
			return
		}
		switch f.Header.OpCode {
		case ws.OpPing:
			ws.WriteFrame(conn, ws.MaskFrameInPlace(ws.NewPongFrame(f.Payload)))
		case ws.OpClose:
			code, reason := ws.ParseCloseFrameData(f.Payload)
			if code == 1012 { // service restart
				l.r.mu.Lock()
				l.r.ws1012++
				l.r.mu.Unlock()
			} else if !l.stopping.Load() {
				l.r.fail("WebSocket to %s closed with %d %q", host, code, reason)
			}
			return
		}
	}
}
