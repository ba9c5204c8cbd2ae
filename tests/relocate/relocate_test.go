package relocate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/bucket"
	"github.com/lchat/lchat-caddy/mesh"
	"github.com/lchat/lchat-caddy/spacestore"
	"github.com/lchat/lchat-caddy/tests/harness"
)

const (
	meshDomain = "mesh.test"
	meshToken  = "relocate-mesh-token-77b1-2f4e6a8c0d1b3e5a"
	dnsToken   = "dnsimple-token-never-logged"
	dnsAccount = 4242
	fiAddress  = "203.0.113.9"
)

// fakeDNSimple replays the parts of the DNSimple API v2 the dnsimple provider uses
// (whoami, zone, records: list with filters, create, update, delete) for the zone
// mesh.test.
type fakeDNSimple struct {
	mu      sync.Mutex
	records map[int64]map[string]any
	nextID  int64
}

func (f *fakeDNSimple) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	reply := func(status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(v)
	}
	if r.Header.Get("Authorization") != "Bearer "+dnsToken {
		reply(http.StatusUnauthorized, map[string]string{"message": "Authentication failed"})
		return
	}
	if r.URL.Path == "/v2/whoami" {
		reply(http.StatusOK, map[string]any{"data": map[string]any{"user": nil, "account": map[string]any{"id": dnsAccount, "email": "ops@example.com"}}})
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, fmt.Sprintf("/v2/%d/zones/", dnsAccount))
	parts := strings.Split(rest, "/")
	if !ok || parts[0] != meshDomain {
		reply(http.StatusNotFound, map[string]string{"message": "Zone not found"})
		return
	}
	switch {
	case len(parts) == 1:
		reply(http.StatusOK, map[string]any{"data": map[string]any{"id": 77, "account_id": dnsAccount, "name": meshDomain}})
	case len(parts) == 2 && r.Method == http.MethodGet:
		q := r.URL.Query()
		out := []map[string]any{}
		for id := int64(1); id <= f.nextID; id++ {
			rec, ok := f.records[id]
			if !ok || q.Has("name") && rec["name"] != q.Get("name") ||
				q.Get("name_like") != "" && !strings.Contains(rec["name"].(string), q.Get("name_like")) ||
				q.Get("type") != "" && rec["type"] != q.Get("type") {
				continue
			}
			out = append(out, rec)
		}
		reply(http.StatusOK, map[string]any{"data": out, "pagination": map[string]int{"current_page": 1, "per_page": 100, "total_entries": len(out), "total_pages": 1}})
	case len(parts) == 2 && r.Method == http.MethodPost:
		var rec map[string]any
		json.NewDecoder(r.Body).Decode(&rec)
		f.nextID++
		rec["id"], rec["zone_id"] = f.nextID, meshDomain
		f.records[f.nextID] = rec
		reply(http.StatusCreated, map[string]any{"data": rec})
	case len(parts) == 3:
		id, _ := strconv.ParseInt(parts[2], 10, 64)
		rec, ok := f.records[id]
		if !ok {
			reply(http.StatusNotFound, map[string]string{"message": "Record not found"})
			return
		}
		switch r.Method {
		case http.MethodDelete:
			delete(f.records, id)
			w.WriteHeader(http.StatusNoContent)
		case http.MethodPatch:
			var upd map[string]any
			json.NewDecoder(r.Body).Decode(&upd)
			for k, v := range upd {
				rec[k] = v
			}
			reply(http.StatusOK, map[string]any{"data": rec})
		}
	default:
		reply(http.StatusNotImplemented, map[string]string{"message": "not replayed"})
	}
}

// a returns the contents of name's A records.
func (f *fakeDNSimple) a(name string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, rec := range f.records {
		if rec["name"] == name && rec["type"] == "A" {
			out = append(out, fmt.Sprint(rec["content"]))
		}
	}
	return out
}

// meshNode is one box of a region, on its region's bucket.
type meshNode struct {
	*harness.Box
	addr, self string
}

func meshBox(t *testing.T, ip, region string, s3 *harness.S3, prefix string, meshOpts map[string]any) *meshNode {
	t.Helper()
	addr := harness.FreeAddr(t, ip)
	n := &meshNode{addr: addr, self: "http://" + addr}
	meshOpts["beat"], meshOpts["dead_after"] = "1s", "3s"
	raw := harness.Config{
		Listen: addr,
		Lchat: map[string]any{
			"mesh": meshOpts,
			"kinds": map[string]any{"demo": harness.DemoKind(map[string]any{
				"idle_timeout": "1s", "replication": map[string]any{"class": "sleep"},
			})},
		},
		MeshAPIHost: ip,
	}.JSON()
	env := append(s3.Env(prefix), mesh.EnvSelf+"="+n.self, mesh.EnvDomains+"="+meshDomain,
		mesh.EnvToken+"="+meshToken, "LCHAT_MESH_REGION="+region)
	n.Box = harness.StartBox(t, harness.BoxOptions{JSON: raw, Env: env, IP: ip})
	return n
}

func (n *meshNode) do(t *testing.T, method, host, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+n.addr+path, strings.NewReader(body))
	req.Host = host
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("%s %s%s via %s: %v", method, host, path, n.self, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func asleep(t *testing.T, n *meshNode, host string) bool {
	var st struct {
		Spaces []struct {
			Host  string `json:"host"`
			State string `json:"state"`
		} `json:"spaces"`
	}
	n.AdminJSON("GET", "/lchat/status", nil, 200, &st)
	for _, s := range st.Spaces {
		if s.Host == host && s.State != "asleep" && s.State != "stopped" && s.State != "idle" {
			return false
		}
	}
	return true
}

// TestRelocateAcrossRegionBuckets: ie and fi keep spaces in their own S3 servers. A
// space checkpointed in ie relocates to fi with --move-dns: its bytes are copied to fi's
// bucket (without the lease), the fi box serves its messages, the A record points at
// the fi box's public address; a re-run is a no-op, and a relocation while the space is
// awake in fi is refused with nothing changed.
func TestRelocateAcrossRegionBuckets(t *testing.T) {
	s3ie, s3fi := harness.StartS3(t), harness.StartS3(t)
	fake := &fakeDNSimple{records: map[int64]map[string]any{}}
	dnsSrv := httptest.NewServer(fake)
	t.Cleanup(dnsSrv.Close)

	fi := meshBox(t, "127.0.0.2", "fi", s3fi, "fi/", map[string]any{"public_address": fiAddress})
	ie := meshBox(t, "127.0.0.1", "ie", s3ie, "ie/", map[string]any{
		"region_buckets": map[string]any{"fi": map[string]any{
			"backend": "s3", "bucket": s3fi.Bucket, "prefix": "fi/", "region": s3fi.Region,
			"endpoint": s3fi.Endpoint, "use_path_style": true,
			"access_key_id": s3fi.AccessKey, "secret_access_key": s3fi.SecretKey,
		}},
		"relocate_dns": map[string]any{
			"provider": map[string]any{"name": "dnsimple", "api_access_token": dnsToken,
				"account_id": strconv.Itoa(dnsAccount), "api_url": dnsSrv.URL},
			"zone": meshDomain, "ttl": "2m",
		},
	})
	t.Cleanup(func() {
		for _, n := range []*meshNode{ie, fi} {
			for name, secret := range map[string]string{"the DNS token": dnsToken, "the fi S3 secret": s3fi.SecretKey, "the mesh token": meshToken} {
				if strings.Contains(n.Logs(), secret) {
					t.Errorf("%s logged %s", n.self, name)
				}
			}
		}
	})

	const host = "room." + meshDomain
	hib := true
	ie.AdminJSON("POST", "/lchat/routes", map[string]any{"host": host, "kind": "demo", "hibernate": &hib, "home_region": "ie"}, 201, nil)
	if code, body := ie.do(t, "POST", host, "/api/messages", `{"author":"ops","text":"written in ie"}`); code != http.StatusCreated {
		t.Fatalf("posting in ie: %d %s", code, body)
	}
	ieBkt, fiBkt := s3ie.NewBucket(t, "ie/"), s3fi.NewBucket(t, "fi/")
	ctx := context.Background()
	harness.WaitFor(t, 30*time.Second, "the space to sleep and checkpoint in ie", func() bool {
		m, _, err := spacestore.ReadManifest(ctx, ieBkt, host)
		l, _, lerr := spacestore.ReadLease(ctx, ieBkt, host)
		return err == nil && m != nil && lerr == nil && l.Released && asleep(t, ie, host)
	})
	srcManifest, _, _ := spacestore.ReadManifest(ctx, ieBkt, host)

	// --move-dns to a region with no live box advertising an address: refused first.
	if out, err := ie.CLI("relocate", host, "--to", "us", "--move-dns"); err == nil || !strings.Contains(out, "nothing was changed") {
		t.Errorf("relocate --to us --move-dns with no us box: err=%v\n%s", err, out)
	}
	var row struct {
		HomeRegion string `json:"home_region"`
	}
	ie.AdminJSON("GET", "/lchat/routes/"+host, nil, 200, &row)
	if row.HomeRegion != "ie" {
		t.Fatalf("a refused relocation changed home_region to %q", row.HomeRegion)
	}

	out, err := ie.CLI("relocate", host, "--to", "fi", "--move-dns")
	if err != nil || !strings.Contains(out, "relocated "+host+": ie → fi") ||
		!strings.Contains(out, fmt.Sprintf("copied generation %d", srcManifest.Generation)) ||
		!strings.Contains(out, "dns: A "+host+" → "+fiAddress) {
		t.Fatalf("relocate --to fi --move-dns: %v\n%s", err, out)
	}
	t.Logf("relocate output:\n%s", out)
	if got := fake.a("room"); len(got) != 1 || got[0] != fiAddress {
		t.Errorf("A records of room after relocation: %v, want [%s]", got, fiAddress)
	}
	m, _, err := spacestore.ReadManifest(ctx, fiBkt, host)
	if err != nil || m == nil || m.Generation != srcManifest.Generation {
		t.Fatalf("fi manifest %+v %v, want generation %d", m, err, srcManifest.Generation)
	}
	if _, err := fiBkt.Head(ctx, spacestore.LeaseKey(host)); !errors.Is(err, bucket.ErrNotFound) {
		t.Errorf("the lease was copied to fi (err=%v)", err)
	}
	harness.WaitFor(t, 10*time.Second, "the fi box to get the route with home_region fi", func() bool {
		code, body, _ := fi.Admin("GET", "/lchat/routes/"+host, nil)
		var got struct {
			HomeRegion string `json:"home_region"`
		}
		return code == 200 && json.Unmarshal(body, &got) == nil && got.HomeRegion == "fi"
	})
	// The fi box wakes the space from its own bucket, with the message written in ie.
	if code, body := fi.do(t, "GET", host, "/api/messages", ""); code != 200 || !strings.Contains(body, "written in ie") {
		t.Fatalf("reading the room via fi: %d %s", code, body)
	}

	// Awake in fi now: a relocation (even to where it is) refuses to copy over it.
	out, err = ie.CLI("relocate", host, "--to", "fi")
	if err == nil || !strings.Contains(out, "awake") {
		t.Errorf("relocate while awake in fi: err=%v\n%s", err, out)
	}
	// Asleep again: a re-run copies nothing (fi has the same or a newer generation).
	harness.WaitFor(t, 30*time.Second, "the space to sleep in fi", func() bool {
		l, _, err := spacestore.ReadLease(ctx, fiBkt, host)
		return err == nil && l.Released
	})
	before, _ := fiBkt.Head(ctx, spacestore.ManifestKey(host))
	out, err = ie.CLI("relocate", host, "--to", "fi")
	if err != nil || !strings.Contains(out, "already has home region fi") || !strings.Contains(out, "no copy") {
		t.Errorf("re-run: %v\n%s", err, out)
	}
	if after, _ := fiBkt.Head(ctx, spacestore.ManifestKey(host)); after.ETag != before.ETag {
		t.Errorf("a re-run rewrote fi's manifest")
	}
}
