package s3bucket

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestTransientErrorRetriedAfterAnOutage: after an outage in which every attempt failed
// (a cut link: the retries spent and never refunded), a request whose first attempt meets
// one reset is still retried and succeeds. With the SDK's default client-side retry quota
// the outage drained it, and the request failed with "retry quota exceeded" (a relocation
// failed so in the fault campaign).
func TestTransientErrorRetriedAfterAnOutage(t *testing.T) {
	var outage atomic.Bool
	var attempt atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if outage.Load() || attempt.Add(1)%2 == 1 {
			// A reset: the connection ends with no answer.
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.Header().Set("ETag", `"e"`)
		w.Header().Set("Content-Length", "2")
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	b, err := New(context.Background(), Config{Bucket: "b", Endpoint: srv.URL, UsePathStyle: true,
		Region: "us-east-1", AccessKeyID: "AKIDTEST", SecretAccessKey: "test-secret"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	outage.Store(true)
	for range 40 { // 40 requests x 2 failed retries: far more than the default quota of 500 tokens
		if obj, err := b.Get(ctx, "k"); err == nil {
			obj.Body.Close()
			t.Fatal("a request succeeded during the outage")
		}
	}
	outage.Store(false)
	attempt.Store(0) // the next attempt fails once, the retry answers
	obj, err := b.Get(ctx, "k")
	if err != nil {
		t.Fatalf("request with one transient reset after the outage: %v", err)
	}
	data, _ := io.ReadAll(obj.Body)
	obj.Body.Close()
	if string(data) != "ok" {
		t.Fatalf("body %q", data)
	}
}
