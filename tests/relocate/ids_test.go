// Package relocate runs real lchat-caddy processes against real S3 (versitygw) for the
// mesh's cross-region pieces: the shared id ledger (LCHAT_CLOUD_ID_LEDGER) and space
// relocation.
package relocate

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/lchat/lchat-caddy/ledger"
	"github.com/lchat/lchat-caddy/tests/harness"
)

// boxConfig is a box with the lchat app on the S3 bucket of its environment.
func boxConfig() string { return harness.Config{}.JSON() }

// TestIDLedgerTwoBoxes: two real boxes on one bucket allocating at once never hand out
// the same id; seeding refuses to lower and raises every later id; a box without
// LCHAT_CLOUD_ID_LEDGER answers 404 saying so.
func TestIDLedgerTwoBoxes(t *testing.T) {
	s3 := harness.StartS3(t)
	const prefix, ns = "ids/", "spaces"
	env := append(s3.Env(prefix), "LCHAT_CLOUD_ID_LEDGER="+ns)
	boxes := []*harness.Box{
		harness.StartBox(t, harness.BoxOptions{JSON: boxConfig(), Env: env}),
		harness.StartBox(t, harness.BoxOptions{JSON: boxConfig(), Env: env, IP: "127.0.0.2"}),
	}

	// Switching the ledger on for a namespace with ids minted before: seed first.
	const legacy = 5000
	if out, err := boxes[0].CLI("seed-ids", strconv.Itoa(legacy+1)); err != nil || !strings.Contains(out, "next id is 5001") {
		t.Fatalf("seed-ids %d on a fresh namespace: %v\n%s", legacy+1, err, out)
	}

	const workers, each = 8, 40 // per box
	var mu sync.Mutex
	seen := map[uint64]string{}
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for bi, b := range boxes {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; i++ {
					status, body, err := b.Admin(http.MethodPost, "/lchat/ids", nil)
					if err != nil || status != http.StatusOK {
						errs <- fmt.Errorf("box %d: POST /lchat/ids: %d %s %v", bi, status, body, err)
						return
					}
					var res struct {
						Namespace string `json:"namespace"`
						ID        uint64 `json:"id"`
					}
					if err := json.Unmarshal(body, &res); err != nil || res.ID == 0 || res.Namespace != ns {
						errs <- fmt.Errorf("box %d: answer %s: %v", bi, body, err)
						return
					}
					mu.Lock()
					if prev, dup := seen[res.ID]; dup {
						errs <- fmt.Errorf("id %d handed out twice (box %s and box %d)", res.ID, prev, bi)
					}
					seen[res.ID] = strconv.Itoa(bi)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(seen) != 2*workers*each {
		t.Fatalf("%d distinct ids, want %d", len(seen), 2*workers*each)
	}
	var maxID uint64
	for id := range seen {
		maxID = max(maxID, id)
		if id <= legacy {
			t.Errorf("id %d handed out at or below the seeded legacy maximum %d", id, legacy)
		}
	}
	bkt := s3.NewBucket(t, prefix)
	next, err := ledger.Current(context.Background(), bkt, ns)
	if err != nil {
		t.Fatal(err)
	}
	if next <= maxID {
		t.Errorf("ledger counter at %d, not above the highest id handed out (%d)", next, maxID)
	}
	t.Logf("%d ids from 2 boxes, highest %d, ledger counter %d (block %d)", len(seen), maxID, next, ledger.DefaultBlock)

	// Seeding below what is reserved is refused and changes nothing.
	if out, err := boxes[0].CLI("seed-ids", "5"); err == nil || !strings.Contains(out, "refusing to lower") {
		t.Errorf("seed-ids 5 after %d ids: err=%v\n%s", len(seen), err, out)
	}
	if cur, _ := ledger.Current(context.Background(), bkt, ns); cur != next {
		t.Errorf("a refused seed moved the counter from %d to %d", next, cur)
	}
	// Seeding above on a box drops that box's reserved block: its next id is at least
	// the seed. (Another box finishes the block it reserved before the seed: see ids.go.)
	seed := next + 10000
	if out, err := boxes[1].CLI("seed-ids", strconv.FormatUint(seed, 10)); err != nil || !strings.Contains(out, "next id is "+strconv.FormatUint(seed, 10)) {
		t.Fatalf("seed-ids %d: %v\n%s", seed, err, out)
	}
	out, err := boxes[1].CLI("next-id")
	if err != nil {
		t.Fatalf("next-id: %v\n%s", err, out)
	}
	if id, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64); err != nil || id < seed || seen[id] != "" {
		t.Errorf("next-id after seeding %d: %q", seed, out)
	}

	// Without the env the endpoints are off, and say why.
	off := harness.StartBox(t, harness.BoxOptions{JSON: boxConfig(), Env: s3.Env(prefix), IP: "127.0.0.3"})
	status, body, err := off.Admin(http.MethodPost, "/lchat/ids", nil)
	if err != nil || status != http.StatusNotFound || !strings.Contains(string(body), "LCHAT_CLOUD_ID_LEDGER is not set") {
		t.Errorf("POST /lchat/ids without the env: %d %s %v", status, body, err)
	}
	if out, err := off.CLI("next-id"); err == nil || !strings.Contains(out, "LCHAT_CLOUD_ID_LEDGER") {
		t.Errorf("next-id without the env: err=%v\n%s", err, out)
	}
}
