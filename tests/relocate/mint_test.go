package relocate

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/lchat/lchat-caddy/tests/harness"
)

// mintConfig is boxConfig with a managed wildcard domain (issued by Caddy's internal CA,
// which needs no DNS challenge): minted hosts go under it.
func mintConfig(t *testing.T) string {
	var cfg map[string]any
	if err := json.Unmarshal([]byte(boxConfig()), &cfg); err != nil {
		t.Fatal(err)
	}
	apps := cfg["apps"].(map[string]any)
	apps["lchat"].(map[string]any)["wildcard_domains"] = []string{"mint.test"}
	apps["tls"] = map[string]any{"automation": map[string]any{"policies": []any{
		map[string]any{"issuers": []any{map[string]any{"module": "internal"}}},
	}}}
	b, _ := json.Marshal(cfg)
	return string(b)
}

// TestMintTwoBoxes: two boxes on one bucket with LCHAT_CLOUD_ID_LEDGER mint hosts at
// once, through the admin API and `add-instance --mint`; every host is
// <base36(id)>.mint.test and none is minted twice. A box without the ledger mints from
// its own counter.
func TestMintTwoBoxes(t *testing.T) {
	s3 := harness.StartS3(t)
	env := append(s3.Env("mint/"), "LCHAT_CLOUD_ID_LEDGER=spaces")
	boxes := []*harness.Box{
		harness.StartBox(t, harness.BoxOptions{JSON: mintConfig(t), Env: env}),
		harness.StartBox(t, harness.BoxOptions{JSON: mintConfig(t), Env: env, IP: "127.0.0.2"}),
	}
	const workers, each = 4, 25 // per box
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for bi, b := range boxes {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; i++ {
					status, body, err := b.Admin(http.MethodPost, "/lchat/routes", json.RawMessage(`{"mint":true,"upstream":"127.0.0.1:9"}`))
					if err != nil || status != http.StatusCreated {
						t.Errorf("box %d: minting: %d %s %v", bi, status, body, err)
						return
					}
					var sum struct {
						Host string `json:"host"`
					}
					json.Unmarshal(body, &sum)
					mu.Lock()
					if prev, dup := seen[sum.Host]; dup {
						t.Errorf("%s minted by box %d and box %d", sum.Host, prev, bi)
					}
					seen[sum.Host] = bi
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	if len(seen) != 2*workers*each {
		t.Fatalf("%d distinct hosts, want %d", len(seen), 2*workers*each)
	}
	for host := range seen {
		label, ok := strings.CutSuffix(host, ".mint.test")
		if id, err := strconv.ParseUint(label, 36, 64); !ok || err != nil || id == 0 {
			t.Errorf("minted %q, want <base36(id)>.mint.test", host)
		}
	}

	// The CLI: the host it prints is a route on that box.
	out, err := boxes[1].CLI("add-instance", "--mint", "--upstream", "127.0.0.1:9")
	if err != nil {
		t.Fatalf("add-instance --mint: %v\n%s", err, out)
	}
	host := strings.Fields(out)[1] // "host:  <host>"
	if _, dup := seen[host]; dup || !strings.HasSuffix(host, ".mint.test") {
		t.Fatalf("add-instance --mint printed %q", out)
	}
	if status, _, _ := boxes[1].Admin(http.MethodGet, "/lchat/routes/"+host, nil); status != http.StatusOK {
		t.Fatalf("minted %s has no route: %d", host, status)
	}
	if out, err := boxes[1].CLI("add-instance", "x.mint.test", "--mint", "--upstream", "127.0.0.1:9"); err == nil {
		t.Fatalf("add-instance with a host and --mint succeeded:\n%s", out)
	}

	// Without the ledger: a counter of the box's own, from 1.
	solo := harness.StartBox(t, harness.BoxOptions{JSON: mintConfig(t), Env: s3.Env("solo/"), IP: "127.0.0.3"})
	mint := func(body string) (int, string) {
		status, out, err := solo.Admin(http.MethodPost, "/lchat/routes", json.RawMessage(body))
		if err != nil {
			t.Fatal(err)
		}
		var sum struct {
			Host string `json:"host"`
		}
		json.Unmarshal(out, &sum)
		return status, sum.Host
	}
	for want := 1; want <= 2; want++ {
		if status, host := mint(`{"mint":true,"upstream":"127.0.0.1:9"}`); status != http.StatusCreated || host != fmt.Sprintf("%d.mint.test", want) {
			t.Fatalf("local mint %d: %d %q", want, status, host)
		}
	}
	// A route this box would refuse costs no id; a host and mint together are a 400.
	if status, _ := mint(`{"mint":true,"kind":"nope"}`); status != http.StatusBadRequest {
		t.Fatalf("minting an unknown kind: %d", status)
	}
	if status, _ := mint(`{"mint":true,"host":"a.mint.test","upstream":"127.0.0.1:9"}`); status != http.StatusBadRequest {
		t.Fatalf("host and mint: %d", status)
	}
	if status, host := mint(`{"mint":true,"upstream":"127.0.0.1:9"}`); status != http.StatusCreated || host != "3.mint.test" {
		t.Fatalf("local mint after refusals: %d %q, want 3.mint.test", status, host)
	}
}
