package standby

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"sync"
	"testing"
)

const testToken = "mesh-s3cret-token-value"

// serveSpool serves s's endpoints as the glue does: behind the bearer token, other paths
// 404.
func serveSpool(t *testing.T, s *Spool) *httptest.Server {
	srv, _ := serveSpoolCounted(t, s, true)
	return srv
}

// serveSpoolCounted is serveSpool counting the requests of each endpoint (the last part of
// the path); without stream, it answers the stream's endpoint 404, as a standby of an
// earlier version does.
func serveSpoolCounted(t *testing.T, s *Spool, stream bool) (*httptest.Server, func(op string) int) {
	var mu sync.Mutex
	ops := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testToken {
			http.Error(w, "mesh token missing or wrong", http.StatusUnauthorized)
			return
		}
		op := path.Base(r.URL.Path)
		mu.Lock()
		ops[op]++
		mu.Unlock()
		if op == "stream" && !stream {
			http.Error(w, "no such endpoint", http.StatusNotFound)
			return
		}
		if err := s.ServePeer(w, r); err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, func(op string) int {
		mu.Lock()
		defer mu.Unlock()
		return ops[op]
	}
}

// TestWirePutAndSeal: a holder's puts and a takeover's seal through a real server, each
// refusal arriving as the sentinel the spool returned; over one kept stream, and one
// request each to a standby that offers no stream.
func TestWirePutAndSeal(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) { testWirePutAndSeal(t, stream) })
	}
}

func testWirePutAndSeal(t *testing.T, stream bool) {
	s := openSpool(t, t.TempDir())
	srv, count := serveSpoolCounted(t, s, stream)
	c := &Client{Token: testToken, HTTP: srv.Client()}
	defer c.Close()
	ctx := context.Background()
	want := []Entry{entry(t, 3, 1, claimA, 7), entry(t, 3, 2, claimA, 8)}
	for _, e := range want {
		if err := c.Put(ctx, srv.URL, host, e); err != nil {
			t.Fatal(err)
		}
	}
	wantErr(t, "a retried put", c.Put(ctx, srv.URL, host, want[1]), nil)
	wantErr(t, "a gap", c.Put(ctx, srv.URL, host, entry(t, 3, 4, claimA, 8)), ErrGap)
	wantErr(t, "an older generation", c.Put(ctx, srv.URL, host, entry(t, 2, 5, claimA, 8)), ErrStale)
	wantErr(t, "a conflict", c.Put(ctx, srv.URL, host, entry(t, 3, 2, claimA, 9)), ErrConflict)
	wantErr(t, "a bad host", c.Put(ctx, srv.URL, "A/../b", want[0]), ErrMalformed)
	// Six puts of one host, one at a time, refusals among them: one stream carries them all.
	if stream && (count("stream") != 1 || count("segment") != 0) {
		t.Fatalf("%d streams and %d segment requests for 6 puts; want 1 and 0", count("stream"), count("segment"))
	}
	if !stream && (count("stream") != 1 || count("segment") != 6) {
		t.Fatalf("to a standby without streams: %d stream tries and %d segment requests; want 1 and 6",
			count("stream"), count("segment"))
	}

	got, err := c.Seal(ctx, srv.URL, host, 3, claimA)
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, got, want)
	err = c.Put(ctx, srv.URL, host, entry(t, 3, 3, claimA, 8))
	wantErr(t, "a put after the seal", err, ErrSealed)
	if errors.Is(err, ErrStale) || errors.Is(err, ErrGap) {
		t.Fatalf("a sealed answer matches another sentinel too: %v", err)
	}
	got, err = c.Seal(ctx, srv.URL, host, 3, claimA)
	if err != nil {
		t.Fatal(err)
	}
	sameEntries(t, got, want)
	got, err = c.Seal(ctx, srv.URL, "other.test", 3, claimB)
	if err != nil || len(got) != 0 {
		t.Fatalf("a seal of a host with no stream = %d entries, %v", len(got), err)
	}
	sts, err := c.Status(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if len(sts) != 2 || sts[1].Host != host || !sts[1].Sealed || sts[1].LastSeq != 2 {
		t.Fatalf("status over the wire = %+v", sts)
	}
}

// TestWireErrorsHideTheToken: no error the client returns names the token, whatever the
// answer or failure.
func TestWireErrorsHideTheToken(t *testing.T) {
	s := openSpool(t, t.TempDir())
	srv := serveSpool(t, s)
	ctx := context.Background()
	e := entry(t, 1, 2, claimA, 0)
	for name, c := range map[string]*Client{
		"wrong token": {Token: testToken + "x", HTTP: srv.Client()},
		"right token": {Token: testToken, HTTP: srv.Client()},
	} {
		for _, base := range []string{srv.URL, "http://user:pw@127.0.0.1:1", "http://%zz"} {
			errs := []error{c.Put(ctx, base, host, e)}
			_, err := c.Seal(ctx, base, host, 1, claimA)
			errs = append(errs, err)
			_, err = c.Status(ctx, base+"/nothing")
			errs = append(errs, err)
			for _, err := range errs {
				if err == nil {
					if name == "wrong token" || base != srv.URL {
						t.Fatalf("%s at %s: no error", name, base)
					}
					continue
				}
				if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), ":pw@") {
					t.Fatalf("%s: the error names a secret: %v", name, err)
				}
			}
		}
	}
}

// post sends body to path on srv with the token and returns the status, kind and message.
func post(t *testing.T, srv *httptest.Server, path string, body []byte) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(ErrorHeader), string(msg)
}

func segmentBody(e Entry) []byte {
	return append(binary.BigEndian.AppendUint64(nil, uint64(e.BucketBefore)), e.Data...)
}

// TestWireRefusesMalformedBodies: each malformed request is answered with its status and a
// message saying what is wrong, and stores nothing.
func TestWireRefusesMalformedBodies(t *testing.T) {
	s := openSpool(t, t.TempDir())
	first := entry(t, 1, 1, claimA, 0)
	mustPut(t, s, host, first)
	good := entry(t, 1, 2, claimA, 0)
	s.MaxSegmentBytes = int64(len(good.Data)) + 100
	srv := serveSpool(t, s)
	seg := PathPrefix + host + "/segment"
	neg := segmentBody(good)
	neg[0] = 0x80
	cases := []struct {
		name, path string
		body       []byte
		status     int
		kind, says string
	}{
		{"empty body", seg, nil, 400, "malformed", "8 bytes"},
		{"short body", seg, []byte{0, 0, 0}, 400, "malformed", "8 bytes"},
		{"only BucketBefore", seg, make([]byte, 8), 400, "malformed", "segment"},
		{"garbage segment", seg, append(make([]byte, 8), "hello"...), 400, "malformed", "not a log segment"},
		{"truncated segment", seg, segmentBody(good)[:len(segmentBody(good))-3], 400, "malformed", "decoding segment"},
		{"negative BucketBefore", seg, neg, 400, "malformed", "negative"},
		{"too large", seg, append(segmentBody(good), make([]byte, 200)...), 413, "full", "more than"},
		{"bad host", PathPrefix + "Bad_Host/segment", segmentBody(good), 400, "malformed", "host"},
		{"unknown op", PathPrefix + host + "/other", segmentBody(good), 404, "", "no standby endpoint"},
		{"seal not JSON", PathPrefix + host + "/seal", []byte("{"), 400, "malformed", "JSON"},
		{"seal without claim", PathPrefix + host + "/seal", []byte(`{"gen": 1}`), 400, "malformed", "claim"},
		{"seal, trailing data", PathPrefix + host + "/seal", []byte(`{"gen": 1, "claim": {}} {}`), 400, "malformed", "JSON"},
		{"seal, negative gen", PathPrefix + host + "/seal", []byte(`{"gen": -1, "claim": {}}`), 400, "malformed", "generation"},
		{"seal, huge claim", PathPrefix + host + "/seal", []byte(`{"gen": 1, "claim": {"holder": "` + strings.Repeat("h", 2000) + `"}}`), 400, "malformed", "claim"},
	}
	before := s.Status()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, kind, msg := post(t, srv, c.path, c.body)
			if status != c.status || kind != c.kind || !strings.Contains(msg, c.says) {
				t.Fatalf("answer %d kind %q %q; want %d kind %q saying %q", status, kind, msg, c.status, c.kind, c.says)
			}
			if got := s.Status(); fmt.Sprint(got) != fmt.Sprint(before) {
				t.Fatalf("status changed: %+v, was %+v", got, before)
			}
		})
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+seg, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	if resp, err := srv.Client().Do(req); err != nil || resp.StatusCode != 405 {
		t.Fatalf("GET of the segment endpoint = %v, %v; want 405", resp, err)
	}
	if status, _, msg := post(t, srv, seg, segmentBody(good)); status != 204 {
		t.Fatalf("the good segment after the malformed ones: %d %s", status, msg)
	}
}

// TestClientBoundsTheSealAnswer: a seal's answer larger than MaxSealBytes is an error, and
// one that is not the sealed stream's is refused.
func TestClientBoundsTheSealAnswer(t *testing.T) {
	s := openSpool(t, t.TempDir())
	mustPut(t, s, host, entry(t, 1, 1, claimA, 0), entry(t, 1, 2, claimA, 0))
	srv := serveSpool(t, s)
	ctx := context.Background()
	c := &Client{Token: testToken, HTTP: srv.Client(), MaxSealBytes: 100}
	if _, err := c.Seal(ctx, srv.URL, host, 1, claimA); err == nil || !strings.Contains(err.Error(), "more than 100") {
		t.Fatalf("Seal with a small bound = %v", err)
	}
	// An answer of another stream's segments (a standby that got it wrong).
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(EncodeEntries([]Entry{entry(t, 1, 1, claimB, 0)}))
	}))
	defer other.Close()
	c = &Client{Token: testToken, HTTP: other.Client()}
	if _, err := c.Seal(ctx, other.URL, host, 1, claimA); err == nil || !strings.Contains(err.Error(), "not seq 1 of the sealed stream") {
		t.Fatalf("Seal answered by another stream = %v", err)
	}
}
