// Package deploy tests the production install path: deploy/systemd/install.sh, the
// shipped unit and the shipped single.Caddyfile on a real Debian 12 with systemd as
// PID 1 and pure cgroup v2 (a QEMU guest), as "Configuring a real deployment" in
// docs/operations.md says to run them. TestDeployVM is opt-in (LCHAT_DEPLOY_VM=1, root, 6 to 10 minutes
// under TCG); the checks that need no VM run always (static_test.go). See
// docs/deploy-test.md.
package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lchat/lchat-caddy/tests/harness"
)

const (
	domain   = "deploy.test"
	demoHost = "demo1." + domain
	hogHost  = "hog1." + domain
	s3Root   = "/var/lib/lchat-test-s3"
	bucket   = "lchat"
	prefix   = "prod"
	// curlSpace reaches a space through the box's HTTPS port, verifying the certificate
	// against pebble's root as it was when the box obtained it (saved before the reboot,
	// since pebble makes a new root each start).
	curlSpace = "curl -sS --max-time 60 --cacert /root/pebble-root.pem --resolve %[1]s:443:127.0.0.1 https://%[1]s"
	status    = "curl -sS --max-time 30 --unix-socket /run/lchat-caddy/admin.sock http://admin/lchat/status"
)

// The kind an operator adds to the installed Caddyfile for the memory-limit check: the
// isolation tests' attacker, capped at 64 MiB. Its routes may carry ADMIN_TOKEN (the
// shipped demo kind allows no env), a secret the journal must never show.
const hogKind = `		kind hog {
			command /usr/local/lib/lchat-test/attacker
			allowed_env ADMIN_TOKEN
			isolation on
			ready_path /healthz
			stop_grace 2s
			replication sleep
			limits {
				memory 64MiB
				pids 64
			}
		}
`

type spaceStatus struct {
	Host      string `json:"host"`
	State     string `json:"state"`
	PID       int    `json:"pid"`
	LastCrash string `json:"last_crash"`
}

type boxStatus struct {
	Spaces   []spaceStatus      `json:"spaces"`
	Counters map[string]float64 `json:"counters"`
}

func (s boxStatus) space(host string) spaceStatus {
	for _, sp := range s.Spaces {
		if sp.Host == host {
			return sp
		}
	}
	return spaceStatus{}
}

func (v *vm) status() boxStatus {
	v.t.Helper()
	out := v.run(time.Minute, status)
	var st boxStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		v.t.Fatalf("status: %v: %s", err, out)
	}
	return st
}

// keyValues parses "key=value" lines.
func keyValues(out string) map[string]string {
	m := map[string]string{}
	for l := range strings.SplitSeq(out, "\n") {
		if k, val, ok := strings.Cut(strings.TrimSpace(l), "="); ok {
			m[k] = val
		}
	}
	return m
}

func TestDeployVM(t *testing.T) {
	if os.Getenv("LCHAT_DEPLOY_VM") == "" {
		t.Skip("set LCHAT_DEPLOY_VM=1 to boot a Debian 12 VM and install the box in it (root, 6 to 10 minutes)")
	}
	if os.Geteuid() != 0 {
		t.Skip("the VM test runs as root (mmdebstrap, apt-get)")
	}
	ph := newPhases(t)

	ph.begin("packages")
	needTools(t)

	ph.begin("image")
	img := image(t)

	ph.begin("binaries")
	payload := t.TempDir()
	bin := filepath.Join(payload, "bin")
	// The shipped binary plus the test-only DNS provider that writes the DNS-01 records
	// into pebble-challtestsrv (tests/certs/cmd): the one part that is not production,
	// because a wildcard certificate needs a DNS provider and there is no public DNS here.
	copyFile(t, harness.CertsBinary(t), filepath.Join(bin, "lchat-caddy"), 0o755)
	// install.sh installs lchat-pageread from beside the binary it is given.
	copyFile(t, harness.PageReader(t), filepath.Join(bin, "lchat-pageread"), 0o755)
	for _, tool := range []string{"versitygw", "pebble", "pebble-challtestsrv"} {
		copyFile(t, harness.Tool(t, tool), filepath.Join(bin, tool), 0o755)
	}
	goBuild(t, filepath.Join(bin, "attacker"), "./tests/isolation/attacker")
	goBuild(t, filepath.Join(payload, "vmagent"), "./tests/deploy/vmagent", "CGO_ENABLED=0")

	// The checkout as an operator has it: install.sh finds the Caddyfiles and the unit
	// relative to itself.
	repo := harness.RepoRoot()
	for _, pat := range []string{"deploy/systemd/*", "caddyfiles/*.Caddyfile", "caddyfiles/*.caddy", "tests/certs/testdata/*.caddy"} {
		files, _ := filepath.Glob(filepath.Join(repo, pat))
		for _, f := range files {
			mode := os.FileMode(0o644)
			if strings.HasSuffix(f, ".sh") {
				mode = 0o755
			}
			copyFile(t, f, filepath.Join(payload, "repo", strings.TrimPrefix(f, repo+"/")), mode)
		}
	}
	pebbleDir := pebbleCerts(t)
	copyFile(t, filepath.Join(pebbleDir, "localhost", "cert.pem"), filepath.Join(payload, "pebble", "cert.pem"), 0o644)
	copyFile(t, filepath.Join(pebbleDir, "localhost", "key.pem"), filepath.Join(payload, "pebble", "key.pem"), 0o644)
	copyFile(t, filepath.Join(pebbleDir, "pebble.minica.pem"), filepath.Join(payload, "pebble", "minica.pem"), 0o644)

	token := randHex(16)
	accessKey, secretKey, adminToken := "deploy"+randHex(4), randHex(20), randHex(16)
	writeFile(t, filepath.Join(payload, "token"), token, 0o600)
	writeFile(t, filepath.Join(payload, "test", "secrets"), secretKey+"\n"+adminToken+"\n", 0o600)
	writeFile(t, filepath.Join(payload, "test", "admin-token"), adminToken, 0o600)
	writeFile(t, filepath.Join(payload, "test", "s3.env"),
		"ROOT_ACCESS_KEY_ID="+accessKey+"\nROOT_SECRET_ACCESS_KEY="+secretKey+"\n", 0o600)
	// /data/router.env as step 3 of docs/operations.md writes it, for a versitygw endpoint and the test CA.
	writeFile(t, filepath.Join(payload, "test", "router.env"), strings.Join([]string{
		"LCHAT_HIBERNATE_BUCKET=" + bucket,
		"LCHAT_HIBERNATE_PREFIX=" + prefix,
		"AWS_REGION=us-east-1",
		"AWS_ENDPOINT_URL_S3=http://127.0.0.1:7070",
		"AWS_ACCESS_KEY_ID=" + accessKey,
		"AWS_SECRET_ACCESS_KEY=" + secretKey,
		"LCHAT_WILDCARD_DOMAINS=" + domain,
		"LCHAT_DNS_PROVIDER=lchat_challtestsrv",
		"LCHAT_TEST_ACME_CA=https://127.0.0.1:14000/dir",
		"LCHAT_TEST_ACME_CA_ROOT=/srv/payload/pebble/minica.pem",
		"LCHAT_TEST_CHALLSRV=http://127.0.0.1:8055",
		"LCHAT_TEST_RESOLVER=127.0.0.1:8054",
		"",
	}, "\n"), 0o600)
	writeFile(t, filepath.Join(payload, "test", "hog.kind"), hogKind, 0o644)
	pebbleCfg, _ := json.Marshal(map[string]any{"pebble": map[string]any{
		"listenAddress": "127.0.0.1:14000", "managementListenAddress": "127.0.0.1:15000",
		"certificate": "/srv/payload/pebble/cert.pem", "privateKey": "/srv/payload/pebble/key.pem",
		"httpPort": 5002, "tlsPort": 5001, "ocspResponderURL": "", "externalAccountBindingRequired": false,
		"retryAfter": map[string]int{"authz": 1, "order": 1},
	}})
	writeFile(t, filepath.Join(payload, "test", "pebble.json"), string(pebbleCfg), 0o644)
	// The test's servers run as units of their own, ordered before the box, and come
	// back after the reboot.
	units := map[string]string{
		"lchat-test-s3": "EnvironmentFile=/srv/payload/test/s3.env\n" +
			"ExecStart=/srv/payload/bin/versitygw --port 127.0.0.1:7070 --region us-east-1 --quiet posix " + s3Root + "\n" +
			"ExecStartPost=/bin/sh -c 'until curl -s -o /dev/null http://127.0.0.1:7070/; do sleep 0.5; done'",
		"lchat-test-challtestsrv": `ExecStart=/srv/payload/bin/pebble-challtestsrv -management 127.0.0.1:8055 -dnsserver 127.0.0.1:8053 -http01 "" -https01 "" -tlsalpn01 "" -doh "" -defaultIPv6 ""`,
		"lchat-test-soa":          "ExecStart=/srv/payload/vmagent soa 127.0.0.1:8054 " + domain,
		"lchat-test-pebble": "Environment=PEBBLE_VA_NOSLEEP=1 PEBBLE_WFE_NONCEREJECT=0\n" +
			"ExecStart=/srv/payload/bin/pebble -config /srv/payload/test/pebble.json -dnsserver 127.0.0.1:8053\n" +
			"ExecStartPost=/bin/sh -c 'until curl -s -o /dev/null --cacert /srv/payload/pebble/minica.pem https://127.0.0.1:14000/dir; do sleep 0.5; done'",
	}
	for name, svc := range units {
		writeFile(t, filepath.Join(payload, "test", name+".service"),
			"[Unit]\nRequiresMountsFor=/srv/payload\nBefore=lchat-caddy.service\n\n[Service]\n"+svc+"\nRestart=always\n\n[Install]\nWantedBy=multi-user.target\n", 0o644)
	}

	ph.begin("boot")
	v := bootVM(t, img, payload, token)
	boot1 := v.waitBoot("", 5*time.Minute)
	kv := keyValues(v.run(time.Minute, `
		echo fs=$(stat -fc %T /sys/fs/cgroup)
		echo unified=$(test -e /sys/fs/cgroup/unified && echo yes || echo no)
		echo systemd=$(systemctl --version | head -1 | cut -d' ' -f2)
		echo controllers=$(cat /sys/fs/cgroup/cgroup.controllers)`))
	t.Logf("guest: systemd %s, /sys/fs/cgroup %s, controllers %s", kv["systemd"], kv["fs"], kv["controllers"])
	if kv["fs"] != "cgroup2fs" || kv["unified"] != "no" {
		t.Fatalf("the guest is not pure cgroup v2: %v", kv)
	}

	ph.begin("test servers")
	v.run(5*time.Minute, `set -e
		mkdir -p `+s3Root+`/`+bucket+`
		cp /srv/payload/test/lchat-test-*.service /etc/systemd/system/
		systemctl daemon-reload
		systemctl enable --now lchat-test-s3 lchat-test-challtestsrv lchat-test-soa lchat-test-pebble`)
	v.waitFor("pebble and challtestsrv answer", 3*time.Minute, `set -e
		curl -sS --max-time 10 -o /dev/null --cacert /srv/payload/pebble/minica.pem https://127.0.0.1:14000/dir
		curl -sS --max-time 10 -o /dev/null -d '{"ip":"127.0.0.1"}' http://127.0.0.1:8055/set-default-ipv4
		curl -sS --max-time 10 -o /dev/null http://127.0.0.1:7070/`)

	ph.begin("install.sh")
	// docs/operations.md "Configuring a real deployment", steps 3 and 4, as an operator runs them:
	// /data/router.env, then install.sh from the checkout. The test's DNS snippet goes
	// beside the Caddyfile, as docs/certificates.md says of another provider's.
	out := v.run(5*time.Minute, `set -e
		install -d -m 0755 /data
		install -m 0600 /srv/payload/test/router.env /data/router.env
		cd /srv/payload/repo
		deploy/systemd/install.sh /srv/payload/bin/lchat-caddy single
		install -m 0644 tests/certs/testdata/dns-lchat_challtestsrv.caddy /etc/lchat-caddy/
		install -D -m 0755 /srv/payload/bin/attacker /usr/local/lib/lchat-test/attacker`)
	t.Logf("install.sh:\n%s", out)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lchat-caddy journal tail:\n%s", journal(v))
		}
	})

	ph.begin("enable --now")
	if out, code := v.try(10*time.Minute, "systemctl enable --now lchat-caddy"); code != 0 {
		t.Fatalf("systemctl enable --now lchat-caddy exited %d:\n%s\njournal:\n%s", code, out, journal(v))
	}
	kv = keyValues(v.run(time.Minute, `
		pid=$(systemctl show -p MainPID --value lchat-caddy)
		cg=$(systemctl show -p ControlGroup --value lchat-caddy)
		echo active=$(systemctl is-active lchat-caddy)
		echo delegate=$(systemctl show -p Delegate --value lchat-caddy)
		echo pid=$pid
		echo cg=$cg
		echo own=$(cut -d: -f3 /proc/$pid/cgroup)
		echo subtree=$(cat /sys/fs/cgroup$cg/cgroup.subtree_control)
		echo uid=$(awk '/^Uid:/{print $2}' /proc/$pid/status)
		echo lchat=$(id -u lchat)
		echo capeff=$(awk '/^CapEff:/{print $2}' /proc/$pid/status)`))
	t.Logf("box: %v", kv)
	if kv["active"] != "active" || kv["delegate"] != "yes" {
		t.Fatalf("lchat-caddy is %s with Delegate=%s", kv["active"], kv["delegate"])
	}
	if kv["own"] != kv["cg"]+"/box" {
		t.Errorf("the box runs in cgroup %s, want the box leaf %s/box", kv["own"], kv["cg"])
	}
	for _, c := range []string{"memory", "cpu", "pids"} {
		if !slicesContains(strings.Fields(kv["subtree"]), c) {
			t.Errorf("the unit's cgroup enables %q for its children, want %s among them", kv["subtree"], c)
		}
	}
	if kv["uid"] != kv["lchat"] || kv["uid"] == "0" {
		t.Errorf("the box runs as uid %s, want the lchat user (%s)", kv["uid"], kv["lchat"])
	}
	boxPID, unitCG, lchatUID := kv["pid"], kv["cg"], kv["lchat"]

	ph.begin("CLI over the admin socket")
	// Step 5: the CLI finds /run/lchat-caddy/admin.sock by itself, as root or as the
	// lchat user; no one else may open it. (Its example used to add --env ADMIN_TOKEN=...,
	// which the shipped demo kind refuses: it allows no env.)
	v.run(2*time.Minute, `set -e
		lchat-caddy add-instance `+demoHost+` --kind demo
		runuser -u lchat -- lchat-caddy routes | grep -q `+demoHost)
	if out, code := v.try(2*time.Minute, "runuser -u nobody -- lchat-caddy routes"); code == 0 {
		t.Errorf("user nobody listed the routes through the admin socket:\n%s", out)
	}

	ph.begin("wake over HTTPS")
	v.waitFor("a wildcard certificate from pebble and the space over verified HTTPS", 6*time.Minute, `set -e
		curl -sSk --max-time 10 https://127.0.0.1:15000/roots/0 >/root/pebble-root.pem
		`+fmt.Sprintf(curlSpace, demoHost)+`/healthz | grep -q ok`)
	v.run(2*time.Minute, fmt.Sprintf(curlSpace, demoHost)+`/api/messages -f -H 'Content-Type: application/json' -d '{"author":"deploy","text":"before-reboot"}'`)
	demo := v.status().space(demoHost)
	if demo.State != "awake" || demo.PID == 0 {
		t.Fatalf("%s after a request: %+v, want awake with a pid", demoHost, demo)
	}
	kv = keyValues(v.run(time.Minute, fmt.Sprintf(`
		echo uid=$(awk '/^Uid:/{print $2}' /proc/%[1]d/status)
		echo groups=$(awk '/^Groups:/{print $2}' /proc/%[1]d/status)
		echo capeff=$(awk '/^CapEff:/{print $2}' /proc/%[1]d/status)
		echo cg=$(cut -d: -f3 /proc/%[1]d/cgroup)`, demo.PID)))
	t.Logf("space %s: %v", demoHost, kv)
	uid, _ := strconv.Atoi(kv["uid"])
	if uid < 3000000 || uid >= 3000000+65536 || kv["uid"] == lchatUID {
		t.Errorf("%s runs as uid %s, want its own uid in 3000000-3065535", demoHost, kv["uid"])
	}
	if kv["groups"] != "" || kv["capeff"] != "0000000000000000" {
		t.Errorf("%s has groups %q and capabilities %s, want none", demoHost, kv["groups"], kv["capeff"])
	}
	if want := unitCG + "/lchat-" + boxPID + "/" + demoHost; kv["cg"] != want {
		t.Errorf("%s runs in cgroup %s, want %s", demoHost, kv["cg"], want)
	}

	ph.begin("reload with a new kind")
	// An operator adds a kind to the installed Caddyfile and reloads: the awake instance
	// keeps running, the box keeps its pid.
	v.run(time.Minute, `set -e
		awk -v f=/srv/payload/test/hog.kind '/^\t\tkind demo \{/{while((getline l < f)>0) print l} {print}' /etc/lchat-caddy/Caddyfile >/tmp/Caddyfile
		grep -q 'kind hog' /tmp/Caddyfile
		cat /tmp/Caddyfile >/etc/lchat-caddy/Caddyfile`)
	if out, code := v.try(5*time.Minute, "systemctl reload lchat-caddy"); code != 0 {
		t.Fatalf("systemctl reload lchat-caddy exited %d:\n%s\njournal:\n%s", code, out, journal(v))
	}
	kv = keyValues(v.run(time.Minute, "echo active=$(systemctl is-active lchat-caddy); echo pid=$(systemctl show -p MainPID --value lchat-caddy)"))
	if kv["active"] != "active" || kv["pid"] != boxPID {
		t.Errorf("after reload the box is %s with pid %s, want active with pid %s", kv["active"], kv["pid"], boxPID)
	}
	if after := v.status().space(demoHost); after.State != "awake" || after.PID != demo.PID {
		t.Errorf("after reload %s is %+v, want still awake with pid %d", demoHost, after, demo.PID)
	}
	v.run(2*time.Minute, fmt.Sprintf(curlSpace, demoHost)+`/api/messages | grep -q before-reboot`)

	ph.begin("memory limit")
	v.run(2*time.Minute, "lchat-caddy add-instance "+hogHost+" --kind hog --env ADMIN_TOKEN=$(cat /srv/payload/test/admin-token)")
	v.run(3*time.Minute, fmt.Sprintf(curlSpace, hogHost)+"/healthz | grep -q ok")
	if out, code := v.try(3*time.Minute, fmt.Sprintf(curlSpace, hogHost)+"/hog -X POST"); code == 0 && strings.Contains(out, `"ok"`) {
		t.Fatalf("the hog answered: it was not killed: %s", out)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		st := v.status()
		h := st.space(hogHost)
		if h.State == "asleep" && strings.Contains(h.LastCrash, "out of memory") && st.Counters["oom_kills"] >= 1 {
			t.Logf("hog: %+v, oom_kills %v", h, st.Counters["oom_kills"])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hog was not reported as an out-of-memory crash: %+v, counters %v", h, st.Counters)
		}
		time.Sleep(2 * time.Second)
	}
	v.run(time.Minute, "journalctl -u lchat-caddy --no-pager -o cat | grep -q 'out of memory'")
	if d := v.status().space(demoHost); d.PID != demo.PID {
		t.Errorf("the hog's kill touched %s: %+v", demoHost, d)
	}

	ph.begin("stop drains")
	if out, code := v.try(5*time.Minute, "systemctl stop lchat-caddy"); code != 0 {
		t.Fatalf("systemctl stop exited %d:\n%s", code, out)
	}
	kv = keyValues(v.run(time.Minute, fmt.Sprintf(`
		echo state=$(systemctl show -p ActiveState --value lchat-caddy)
		echo result=$(systemctl show -p Result --value lchat-caddy)
		echo left=$(ps -eo uid= | awk '$1==%s' | wc -l)
		echo lease=$(cat %s/%s/%s/spaces/%s/lease)
		echo manifest=$(test -s %[2]s/%[3]s/%[4]s/spaces/%[5]s/manifest && echo yes)
		echo history=$(ls %[2]s/%[3]s/%[4]s/spaces/%[5]s/history | wc -l)`, strconv.Itoa(uid), s3Root, bucket, prefix, demoHost)))
	t.Logf("after stop: %v", kv)
	if kv["state"] != "inactive" || kv["result"] != "success" {
		t.Errorf("after stop the unit is %s with result %s, want inactive and success (a drain within TimeoutStopSec)", kv["state"], kv["result"])
	}
	if kv["left"] != "0" {
		t.Errorf("%s processes of %s's uid are left after stop", kv["left"], demoHost)
	}
	var lease struct {
		Released bool `json:"released"`
	}
	if err := json.Unmarshal([]byte(kv["lease"]), &lease); err != nil || !lease.Released {
		t.Errorf("%s's lease in the bucket after stop: %q, want released", demoHost, kv["lease"])
	}
	if kv["manifest"] != "yes" || kv["history"] == "0" {
		t.Errorf("%s has no checkpoint in the bucket after stop: manifest %q, %s history entries", demoHost, kv["manifest"], kv["history"])
	}

	// The box's disk keeps no copy that counts: drop the space's local directory, so the
	// reboot's wake can only serve the message from the checkpoint in the bucket.
	v.run(time.Minute, "rm -rf /var/lib/lchat-caddy/spaces/spaces/"+demoHost)

	ph.begin("reboot")
	// No D-Bus in the image, so no systemd-run: a detached shell asks for the reboot
	// once the agent has answered.
	v.run(time.Minute, "setsid sh -c 'sleep 2; systemctl reboot' >/dev/null 2>&1 </dev/null &")
	v.waitBoot(boot1, 6*time.Minute)
	v.waitFor("lchat-caddy active after the reboot", 6*time.Minute, "systemctl is-active lchat-caddy")
	out = v.waitFor("the space served after the reboot", 6*time.Minute, fmt.Sprintf(curlSpace, demoHost)+"/api/messages -f")
	if !strings.Contains(out, "before-reboot") {
		t.Errorf("%s after the reboot, restored from the bucket, lost its message: %s", demoHost, out)
	}

	ph.begin("journal")
	kv = keyValues(v.run(2*time.Minute, `
		echo boots=$(journalctl --list-boots --no-pager | wc -l)
		echo lines=$(journalctl -u lchat-caddy --no-pager -o cat | wc -l)
		echo secrets=$(journalctl --no-pager -o cat | grep -c -F -f /srv/payload/test/secrets)`))
	t.Logf("journal: %v", kv)
	if n, _ := strconv.Atoi(kv["lines"]); n < 10 {
		t.Errorf("the journal holds %s lines of lchat-caddy: the secret check below would prove nothing", kv["lines"])
	}
	if n, _ := strconv.Atoi(kv["boots"]); n < 2 {
		t.Errorf("the journal holds %s boots, want both (persistent journal)", kv["boots"])
	}
	if kv["secrets"] != "0" {
		t.Errorf("the journal holds %s lines with the bucket secret key or a space's env value", kv["secrets"])
	}

	ph.begin("RestrictNamespaces refused")
	// The shipped unit had RestrictNamespaces=true, under which systemd answers clone3
	// with ENOSYS and every isolated wake failed ("fork/exec ...: function not
	// implemented"). A unit that sets it again now stops the box at start, naming it,
	// and "systemctl restart" says so (Caddy sends READY=1 even after a failed load: the
	// unit's ExecStartPost is what fails the start).
	v.run(time.Minute, `set -e
		mkdir -p /etc/systemd/system/lchat-caddy.service.d
		printf '[Service]\nRestrictNamespaces=true\n' >/etc/systemd/system/lchat-caddy.service.d/restrict.conf
		systemctl daemon-reload`)
	if out, code := v.try(5*time.Minute, "systemctl restart lchat-caddy"); code == 0 {
		t.Errorf("the box started under RestrictNamespaces=true, where no isolated space can wake:\n%s", out)
	}
	v.waitFor("the refusal naming clone3 in the journal", 3*time.Minute,
		"journalctl -u lchat-caddy --no-pager -o cat | grep -q 'clone3 is refused'")
	v.run(5*time.Minute, `set -e
		rm /etc/systemd/system/lchat-caddy.service.d/restrict.conf
		systemctl daemon-reload
		systemctl restart lchat-caddy`)
	v.run(3*time.Minute, fmt.Sprintf(curlSpace, demoHost)+"/api/messages -f | grep -q before-reboot")
}

func slicesContains(s []string, x string) bool {
	for _, e := range s {
		if e == x {
			return true
		}
	}
	return false
}

// journal answers the last lines of the box's journal, for a failure message, without
// any line holding one of the test's secrets (the last phase counts those).
func journal(v *vm) string {
	out, _ := v.try(time.Minute, "journalctl -u lchat-caddy --no-pager -n 80 -o cat | grep -v -F -f /srv/payload/test/secrets")
	return out
}

// pebbleCerts is pebble's own test certificates (test/certs in its module): the HTTPS
// certificate of its ACME listener and the CA that signed it.
func pebbleCerts(t *testing.T) string {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/letsencrypt/pebble/v2")
	cmd.Dir = filepath.Join(harness.RepoRoot(), "tools")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("finding pebble's module: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "test", "certs")
}
