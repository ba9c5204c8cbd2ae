package spacestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/bucket/s3bucket"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// armBefore arms a fault right before each Put of a key with suffix, while armed is set.
type armBefore struct {
	bucket.Bucket
	suffix string
	arm    func()
	armed  bool
}

func (a *armBefore) Put(ctx context.Context, key string, body io.Reader, size int64, cond bucket.Cond) (bucket.Info, error) {
	if a.armed && strings.HasSuffix(key, a.suffix) {
		a.armed = false
		a.arm()
	}
	return a.Bucket.Put(ctx, key, body, size, cond)
}

// TestManifestSwapWithLostResponseOnS3: against versitygw through a TCP proxy that
// forwards the manifest PUT and drops its response, the checkpoint is not fenced (the
// SDK's retry, failing its condition because the first PUT landed, is recognized as this
// box's own write) and the bucket ends with every checkpoint.
func TestManifestSwapWithLostResponseOnS3(t *testing.T) {
	if testing.Short() {
		t.Skip("versitygw")
	}
	s3 := harness.StartS3(t)
	proxy := harness.StartTCPProxy(t, strings.TrimPrefix(s3.Config("").Endpoint, "http://"))
	cfg := s3.Config(fmt.Sprintf("amb%d", time.Now().UnixNano()%1e6))
	cfg.Endpoint = "http://" + proxy.Addr()
	viaProxy, err := s3bucket.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ab := &armBefore{Bucket: viaProxy, suffix: "/manifest", arm: func() { proxy.DropResponses(1) }}
	s := newSyncer(t, ab, t.TempDir())
	ctx := context.Background()
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(s.DataDir, 0o700)
	for i, body := range []string{"one", "two", "three"} {
		os.WriteFile(filepath.Join(s.DataDir, "notes.txt"), []byte(body), 0o600)
		ab.armed = i == 1
		_, err := s.Checkpoint(ctx, Periodic, nil, time.Now())
		if errors.Is(err, ErrFenced) {
			t.Fatalf("checkpoint %d with its response dropped: fenced (%v), want its own write recognized", i+1, err)
		}
		if err != nil && i != 1 {
			t.Fatalf("checkpoint %d: %v", i+1, err)
		}
		if err != nil {
			t.Logf("checkpoint 2 with its response dropped: %v (the next one adopts it)", err)
		}
	}
	m, _, err := ReadManifest(ctx, viaProxy, "s.test")
	if err != nil || m == nil {
		t.Fatalf("manifest: %v %v", m, err)
	}
	if sum := fmt.Sprintf("%x", sha256Sum("three")); len(m.Files) != 1 || m.Files[0].SHA256 != sum {
		t.Fatalf("bucket does not hold the last checkpoint: %+v", m)
	}
	t.Logf("manifest generation %d after 3 checkpoints, one with its response dropped", m.Generation)
}
