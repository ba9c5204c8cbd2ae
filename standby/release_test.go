package standby

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lchat/lchat-caddy/spacestore"
)

// TestRelease: a standby's release reaches the holder's ReleaseFunc with what it named,
// and each answer comes back as the holder meant it: released, not its stream (the
// sentinel), or not marked (an error that is neither). A malformed release is a 400 that
// calls nothing.
func TestRelease(t *testing.T) {
	type call struct {
		host, standby string
		gen           int64
		claim         spacestore.Claim
	}
	var calls []call
	answer := error(nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, PathRelease) {
			http.NotFound(w, r)
			return
		}
		ServeRelease(w, r, func(ctx context.Context, host, standby string, gen int64, claim spacestore.Claim) error {
			calls = append(calls, call{host, standby, gen, claim})
			return answer
		})
	}))
	defer srv.Close()
	c := &Client{Token: testToken, HTTP: srv.Client()}
	ctx := context.Background()

	if err := c.Release(ctx, srv.URL, host, "https://standby.example", 4, claimA); err != nil {
		t.Fatalf("release: %v", err)
	}
	if len(calls) != 1 || calls[0] != (call{host, "https://standby.example", 4, claimA}) {
		t.Fatalf("the holder was called with %+v", calls)
	}
	answer = fmt.Errorf("%w: it streams to another box", ErrNotCurrent)
	if err := c.Release(ctx, srv.URL, host, "https://standby.example", 4, claimA); !errors.Is(err, ErrNotCurrent) {
		t.Fatalf("release of a stream the holder does not hold: %v, want ErrNotCurrent", err)
	}
	answer = context.DeadlineExceeded
	err := c.Release(ctx, srv.URL, host, "https://standby.example", 4, claimA)
	if err == nil || errors.Is(err, ErrNotCurrent) || !strings.Contains(err.Error(), "503") || !strings.HasPrefix(err.Error(), "holder ") {
		t.Fatalf("release the holder could not mark: %v, want a 503 from the holder that is not ErrNotCurrent", err)
	}

	calls = nil
	for _, bad := range []struct{ method, path, body string }{
		{"POST", PathRelease + host, `{"gen": 4, "standby": "x"}`},
		{"POST", PathRelease + host, `{"gen": -1, "claim": {"holder": "a"}, "standby": "x"}`},
		{"POST", PathRelease + host, `{"gen": 4, "claim": {"holder": "a"}}`},
		{"POST", PathRelease + host, `{"gen": 4, "claim": {"holder": "a"}, "standby": "x"} {}`},
		{"POST", PathRelease + host, `not json`},
		{"POST", PathRelease + "Not A Host", `{"gen": 4, "claim": {"holder": "a"}, "standby": "x"}`},
		{"GET", PathRelease + host, ""},
	} {
		req, _ := http.NewRequest(bad.method, srv.URL+strings.ReplaceAll(bad.path, " ", "%20"), strings.NewReader(bad.body))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 4 {
			t.Errorf("%s %s %q: %d, want a 4xx", bad.method, bad.path, bad.body, resp.StatusCode)
		}
	}
	if len(calls) != 0 {
		t.Fatalf("malformed releases reached the holder: %+v", calls)
	}
}

// TestUnsealed lists the streams a leaving standby asks holders to release: each host's
// current stream, not a sealed one, not a retired one.
func TestUnsealed(t *testing.T) {
	s := openSpool(t, t.TempDir())
	for _, h := range []string{"a.example.com", "b.example.com", "c.example.com"} {
		if err := s.Put(h, entry(t, 2, 1, claimA, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Seal("b.example.com", 2, claimA); err != nil {
		t.Fatal(err)
	}
	if err := s.Retire("c.example.com", 2, claimA); err != nil {
		t.Fatal(err)
	}
	got := s.Unsealed()
	if len(got) != 1 || got[0] != (StreamRef{Host: "a.example.com", Gen: 2, Claim: claimA}) {
		t.Fatalf("Unsealed: %+v, want a.example.com's stream of generation 2", got)
	}
}
