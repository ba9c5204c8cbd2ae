package ledger

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/s3bucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// dropNextCounterPut arms the proxy to drop the answer of the next counter PUT, when set.
type dropNextCounterPut struct {
	bucket.Bucket
	arm   func()
	armed atomic.Bool
}

func (d *dropNextCounterPut) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	if strings.HasPrefix(key, KeyPrefix) && d.armed.CompareAndSwap(true, false) {
		d.arm()
	}
	return d.Bucket.Put(ctx, key, body, size, cond)
}

// TestLostResponseOnS3: against versitygw through a TCP proxy that forwards the counter's
// conditional PUT and drops its response (the store applied it; the SDK retries the same
// request, which fails its condition), the allocator recognizes the block as its own:
// its ids continue without a gap of a block, and a second allocator's ids never overlap.
func TestLostResponseOnS3(t *testing.T) {
	if testing.Short() {
		t.Skip("versitygw")
	}
	t.Run("versitygw", func(t *testing.T) { lostResponse(t, harness.StartS3(t)) })
	t.Run("seaweedfs", func(t *testing.T) {
		if os.Getenv("LCHAT_S3_SECOND") == "" {
			t.Skip("set LCHAT_S3_SECOND=1 to run against SeaweedFS")
		}
		lostResponse(t, harness.StartSeaweed(t))
	})
}

func lostResponse(t *testing.T, s3 *harness.S3) {
	proxy := harness.StartTCPProxy(t, strings.TrimPrefix(s3.Config("").Endpoint, "http://"))
	cfg := s3.Config(fmt.Sprintf("ledger%d", time.Now().UnixNano()%1e6))
	direct, err := s3bucket.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint = "http://" + proxy.Addr()
	viaProxy, err := s3bucket.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	db := &dropNextCounterPut{Bucket: viaProxy, arm: func() { proxy.DropResponses(1) }}
	a, _ := New(db, "ns", Options{Block: 10})
	other, _ := New(direct, "ns", Options{Block: 10})
	seen := map[uint64]string{}
	var mine []uint64
	take := func(name string, al *Allocator, n int) {
		for range n {
			id, err := al.Next(ctx)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if by, dup := seen[id]; dup {
				t.Fatalf("id %d handed out twice (%s, %s)", id, by, name)
			}
			seen[id] = name
			if al == a {
				mine = append(mine, id)
			}
		}
	}
	take("a", a, 10)        // block 1..10, answered
	take("other", other, 1) // block 11..20
	db.armed.Store(true)
	take("a", a, 10) // block 21..30: the PUT lands, its response is dropped
	take("other", other, 15)
	if a.Recognized() != 1 {
		t.Fatalf("recognized %d lost responses, want 1 (ids %v)", a.Recognized(), mine)
	}
	if mine[10] != 21 || mine[19] != 30 {
		t.Fatalf("a's second block is %d..%d, want 21..30: the block whose response was lost was skipped", mine[10], mine[19])
	}
	cur, err := Current(ctx, direct, "ns")
	if err != nil || cur != 41 {
		t.Fatalf("counter at %d (%v), want 41: four blocks reserved, none wasted", cur, err)
	}
	t.Logf("a's ids %v; counter %d", mine, cur)
}
