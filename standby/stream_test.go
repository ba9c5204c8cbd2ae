package standby

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// connsListener records the connections it accepts, so a test can cut them.
type connsListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *connsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *connsListener) cutAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

// TestStreamSurvivesTheStandbyClosingIt: a kept stream the standby closed meanwhile (its
// idle timeout, a restart) costs the next put nothing but a new connection: it is not an
// error, which would give the standby up.
func TestStreamSurvivesTheStandbyClosingIt(t *testing.T) {
	s := openSpool(t, t.TempDir())
	var streams int
	var mu sync.Mutex
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/stream") {
			mu.Lock()
			streams++
			mu.Unlock()
		}
		s.ServePeer(w, r)
	}))
	ln := &connsListener{Listener: srv.Listener}
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	c := &Client{HTTP: srv.Client()}
	defer c.Close()
	ctx := context.Background()
	for seq := int64(1); seq <= 4; seq++ {
		if err := c.Put(ctx, srv.URL, host, entry(t, 1, seq, claimA, 0)); err != nil {
			t.Fatalf("put %d: %v", seq, err)
		}
		if seq == 2 {
			ln.cutAll()
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if streams != 2 {
		t.Fatalf("%d streams opened for 4 puts with one cut; want 2", streams)
	}
	if st, _ := hostStatus(s, host); st.LastSeq != 4 {
		t.Fatalf("the standby has up to seq %d, want 4", st.LastSeq)
	}
}

// TestStreamPutEndsWithItsContext: a standby that takes a frame and never answers fails
// the put at its deadline, with the deadline's error, rather than hold it.
func TestStreamPutEndsWithItsContext(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Upgrade", StreamProtocol)
		w.Header().Set("Connection", "Upgrade")
		w.WriteHeader(http.StatusSwitchingProtocols)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.Flush()
		<-release
	}))
	defer srv.Close()
	defer close(release)
	c := &Client{HTTP: srv.Client()}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Put(ctx, srv.URL, host, entry(t, 1, 1, claimA, 0))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Put to a standby that never answers = %v; want the deadline's error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Put returned %v after its 200ms deadline", d)
	}
}

// openRawStream opens a stream to srv by hand and returns its connection and reader.
func openRawStream(t *testing.T, srv *httptest.Server, host string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST %s%s/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\nContent-Length: 0\r\n\r\n",
		PathPrefix, host, testToken, StreamProtocol)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("opening a stream: %v %v", resp, err)
	}
	return conn, br
}

// frame is one frame of the stream: BucketBefore, the length and the data.
func frame(bb int64, n uint32, data []byte) []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(bb))
	b = binary.BigEndian.AppendUint32(b, n)
	return append(b, data...)
}

// readAnswer reads one frame's answer: "" once stored, else "kind\x00message".
func readAnswer(t *testing.T, conn net.Conn, br *bufio.Reader) (string, error) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var n [2]byte
	if _, err := io.ReadFull(br, n[:]); err != nil {
		return "", err
	}
	msg := make([]byte, binary.BigEndian.Uint16(n[:]))
	_, err := io.ReadFull(br, msg)
	return string(msg), err
}

// TestStreamRefusesMalformedFrames: each malformed frame is answered with its kind and a
// message and stores nothing; the stream goes on after a refused frame, and ends after one
// it cannot read past. A request that does not ask for the upgrade is a 400.
func TestStreamRefusesMalformedFrames(t *testing.T) {
	s := openSpool(t, t.TempDir())
	good := entry(t, 1, 1, claimA, 0)
	s.MaxSegmentBytes = int64(len(good.Data)) + 100
	srv := serveSpool(t, s)
	if status, kind, msg := post(t, srv, PathPrefix+host+"/stream", nil); status != 400 || kind != "malformed" || !strings.Contains(msg, "Upgrade") {
		t.Fatalf("a stream request without the upgrade: %d %q %q", status, kind, msg)
	}

	conn, br := openRawStream(t, srv, host)
	for _, c := range []struct {
		name  string
		frame []byte
		says  string
	}{
		{"garbage segment", frame(0, 5, []byte("hello")), "malformed\x00"},
		{"empty segment", frame(0, 0, nil), "malformed\x00"},
		{"negative BucketBefore", frame(-1, uint32(len(good.Data)), good.Data), "malformed\x00"},
		{"a gap", frame(0, uint32(len(good.Data)), entry(t, 1, 3, claimA, 0).Data), "gap\x00"},
	} {
		if _, err := conn.Write(c.frame); err != nil {
			t.Fatal(err)
		}
		got, err := readAnswer(t, conn, br)
		if err != nil || !strings.HasPrefix(got, c.says) {
			t.Fatalf("%s: answered %q, %v; want %q...", c.name, got, err, c.says)
		}
		if _, ok := hostStatus(s, host); ok {
			t.Fatalf("%s: stored something", c.name)
		}
	}
	conn.Write(frame(7, uint32(len(good.Data)), good.Data))
	if got, err := readAnswer(t, conn, br); got != "" || err != nil {
		t.Fatalf("the good frame after the refused ones: %q, %v", got, err)
	}
	if st, ok := hostStatus(s, host); !ok || st.LastSeq != 1 {
		t.Fatalf("after the good frame: %+v", st)
	}
	// A length past MaxSegmentBytes: answered, and the stream ends (its bytes are not read).
	conn.Write(frame(0, uint32(s.MaxSegmentBytes)+1, nil))
	if got, err := readAnswer(t, conn, br); !strings.HasPrefix(got, "full\x00") || err != nil {
		t.Fatalf("a frame too large: %q, %v", got, err)
	}
	if _, err := readAnswer(t, conn, br); !errors.Is(err, io.EOF) {
		t.Fatalf("after a frame too large the stream goes on: %v", err)
	}
	// A frame cut short by the holder's end: nothing stored.
	conn, _ = openRawStream(t, srv, host)
	two := entry(t, 1, 2, claimA, 0)
	conn.Write(frame(0, uint32(len(two.Data)), two.Data[:10]))
	conn.Close()
	time.Sleep(50 * time.Millisecond) // the standby's read of the rest fails meanwhile
	if st, _ := hostStatus(s, host); st.LastSeq != 1 {
		t.Fatalf("a frame cut short was stored: %+v", st)
	}
}

// TestClientClosesQuietStreams: the stream of a space that went quiet is closed by the
// holder after clientIdle, not kept open until the standby's idle timeout.
func TestClientClosesQuietStreams(t *testing.T) {
	defer func(d time.Duration) { clientIdle = d }(clientIdle)
	clientIdle = 100 * time.Millisecond
	s := openSpool(t, t.TempDir())
	ended := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.ServePeer(w, r)
		ended <- r.URL.Path
	}))
	defer srv.Close()
	c := &Client{HTTP: srv.Client()}
	defer c.Close()
	ctx := context.Background()
	if err := c.Put(ctx, srv.URL, host, entry(t, 1, 1, claimA, 0)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * clientIdle)
	if err := c.Put(ctx, srv.URL, "other.test", entry(t, 1, 1, claimB, 0)); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-ended:
		if p != PathPrefix+host+"/stream" {
			t.Fatalf("the stream that ended is %s", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the quiet stream is still open")
	}
}
