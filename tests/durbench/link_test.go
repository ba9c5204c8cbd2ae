package durbench

import (
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// bucketLink is the box's bucket link: an HTTP proxy in front of versitygw that counts
// every request the box sends by space and operation (read from the key), and delays each
// one by a settable latency before it goes on, as a round trip to a remote S3 would.
//
// harness.TCPProxy, the shared link, delays only new connections (SetDelay) or each chunk
// by a random time (SetJitter, which a PUT's head and body pay twice), and cannot count
// requests: a box keeps its bucket connections alive, so neither is "20 ms per request".
type bucketLink struct {
	ln      net.Listener
	latency atomic.Int64 // nanoseconds added to every request

	mu     sync.Mutex // guards counts
	counts map[string]map[string]int
}

// startLink serves the link on 127.0.0.1 in front of endpoint (versitygw's base URL)
// until the test ends.
func startLink(t *testing.T, endpoint string) *bucketLink {
	t.Helper()
	target, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &bucketLink{ln: ln, counts: map[string]map[string]int{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = r.In.Host // the box signed the Host it sent (SigV4)
		},
		Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute},
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.record(r)
		if d := time.Duration(l.latency.Load()); d > 0 {
			time.Sleep(d)
		}
		rp.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return l
}

// URL is the link's base URL, the box's S3 endpoint.
func (l *bucketLink) URL() string { return "http://" + l.ln.Addr().String() }

// SetLatency adds d to every request from now on.
func (l *bucketLink) SetLatency(d time.Duration) { l.latency.Store(int64(d)) }

// record counts r under the space its key names ("" for the box's own keys) and its
// operation: the method and the key's part within the space ("PUT log", "GET manifest");
// a listing is "LIST" with the prefix's part.
func (l *bucketLink) record(r *http.Request) {
	op := r.Method
	key := r.URL.Path
	if i := strings.IndexByte(strings.TrimPrefix(key, "/"), '/'); i >= 0 {
		key = strings.TrimPrefix(key, "/")[i+1:] // path style: /<bucket>/<key>
	} else {
		key = ""
	}
	q := r.URL.Query()
	if r.Method == http.MethodGet && (q.Has("list-type") || q.Has("prefix")) {
		op, key = "LIST", q.Get("prefix")
	}
	host, part := "", key
	if i := strings.Index(key, "spaces/"); i >= 0 {
		rest := key[i+len("spaces/"):]
		host, part, _ = strings.Cut(rest, "/")
	}
	part, _, _ = strings.Cut(part, "/")
	l.mu.Lock()
	if l.counts[host] == nil {
		l.counts[host] = map[string]int{}
	}
	l.counts[host][op+" "+part]++
	l.mu.Unlock()
}

// snapshot is a copy of the counts so far, by space and operation.
func (l *bucketLink) snapshot() map[string]map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]map[string]int, len(l.counts))
	for h, m := range l.counts {
		out[h] = maps.Clone(m)
	}
	return out
}

// requests are the bucket requests one space sent between two snapshots, by operation.
type requests map[string]int

// since is what host sent between snapshot a and b.
func since(a, b map[string]map[string]int, host string) requests {
	out := requests{}
	for op, n := range b[host] {
		if d := n - a[host][op]; d > 0 {
			out[op] = d
		}
	}
	return out
}

// tiers splits the requests by S3's request prices: PUT, COPY, POST and LIST; GET, HEAD
// and the rest; DELETE is free.
func (r requests) tiers() (put, get, del int) {
	for op, n := range r {
		switch m, _, _ := strings.Cut(op, " "); m {
		case "PUT", "POST", "LIST":
			put += n
		case "DELETE":
			del += n
		default:
			get += n
		}
	}
	return put, get, del
}

// count is the requests whose operation is op ("PUT log").
func (r requests) count(op string) int { return r[op] }

// total is every request.
func (r requests) total() int {
	n := 0
	for _, v := range r {
		n += v
	}
	return n
}
