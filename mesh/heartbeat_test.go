package mesh

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/lchat/lchat-caddy/bucket/membucket"
)

func TestHeartbeatKey(t *testing.T) {
	k := HeartbeatKey("https://box-1.example.net")
	if k != "mesh/members/aHR0cHM6Ly9ib3gtMS5leGFtcGxlLm5ldA" {
		t.Fatalf("key %s differs from the seed's documented encoding", k)
	}
	if s, ok := SelfFromKey(k); !ok || s != "https://box-1.example.net" {
		t.Fatalf("SelfFromKey = %q, %v", s, ok)
	}
	for _, bad := range []string{"mesh/members/!!", "mesh/members/", "mesh/members/aGVsbG8",
		// The decoder skips CR and LF: a second spelling of box-1's key (found by FuzzSelfFromKey).
		"mesh/members/aHR0cHM6Ly9ib3gt\r\nMS5leGFtcGxlLm5ldA", "mesh/members/aHR0cHM6Ly9ib3gtMS5leGFtcGxlLm5ldA\n"} {
		if _, ok := SelfFromKey(bad); ok {
			t.Errorf("SelfFromKey(%q) accepted", bad)
		}
	}
}

// TestHeartbeatAdvertisesAddressAndBucket: a box's public address and bucket name reach
// its peers through the heartbeat (relocation reads them), and a box without them
// advertises none.
func TestHeartbeatAdvertisesAddressAndBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := membucket.New()
		ctx := t.Context()
		a := newTestMember(t, mem, "https://a.example.net", "fi", func(c *MembershipConfig) {
			c.Address, c.Bucket = "203.0.113.9", "s3://fi-spaces/fi"
		})
		b := newTestMember(t, mem, "https://b.example.net", "ie", nil)
		for _, m := range []*Membership{a, b} {
			if err := m.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer m.Close()
		}
		time.Sleep(time.Second)
		synctest.Wait()
		for i, view := range [][]Member{a.Live(), b.Live()} {
			if len(view) != 2 {
				t.Fatalf("view %d: %+v", i, view)
			}
			if view[0].Address != "203.0.113.9" || view[0].Bucket != "s3://fi-spaces/fi" {
				t.Errorf("view %d: a advertises %q %q", i, view[0].Address, view[0].Bucket)
			}
			if view[1].Address != "" || view[1].Bucket != "" {
				t.Errorf("view %d: b advertises %q %q without either configured", i, view[1].Address, view[1].Bucket)
			}
		}
	})
}
