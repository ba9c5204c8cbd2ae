package deploycheck

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// targetTracking is the TargetTrackingConfiguration of
// `aws autoscaling put-scaling-policy --target-tracking-configuration`, as much of it as a
// policy on a customized metric uses.
type targetTracking struct {
	CustomizedMetricSpecification *struct {
		MetricName string `json:"MetricName"`
		Namespace  string `json:"Namespace"`
		Dimensions []struct {
			Name  string `json:"Name"`
			Value string `json:"Value"`
		} `json:"Dimensions"`
		Statistic string `json:"Statistic"`
		Unit      string `json:"Unit"`
	} `json:"CustomizedMetricSpecification"`
	PredefinedMetricSpecification json.RawMessage `json:"PredefinedMetricSpecification"`
	TargetValue                   *float64        `json:"TargetValue"`
	DisableScaleIn                bool            `json:"DisableScaleIn"`
}

// awsProblems checks the AWS recipe: the target tracking policy tracks the metric
// publish-metric.sh publishes (name, namespace and dimensions: CloudWatch tells metrics apart
// by all three), at 1.0, and the script reads the box's signal where the shipped
// mesh.Caddyfile serves its admin API.
func awsProblems(t *testing.T, policy, script []byte) []string {
	var p []string
	var tt targetTracking
	dec := json.NewDecoder(bytes.NewReader(policy))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&tt); err != nil {
		return []string{"target-tracking.json: " + err.Error()}
	}
	cm := tt.CustomizedMetricSpecification
	if cm == nil {
		return []string{"target-tracking.json: no CustomizedMetricSpecification"}
	}
	if tt.TargetValue == nil || *tt.TargetValue != 1 {
		p = append(p, "target-tracking.json: TargetValue must be 1.0 (the desired count over the boxes in service)")
	}
	if cm.Statistic != "Average" {
		p = append(p, "target-tracking.json: Statistic "+cm.Statistic+", want Average")
	}
	flag := func(name string) string {
		m := regexp.MustCompile(`--` + name + `[ =]+("[^"]*"|\S+)`).FindSubmatch(script)
		if m == nil {
			return ""
		}
		return strings.Trim(string(m[1]), `"`)
	}
	s := string(script)
	if !strings.Contains(s, "put-metric-data") {
		p = append(p, "publish-metric.sh: no aws cloudwatch put-metric-data")
	}
	if got := flag("metric-name"); got != cm.MetricName {
		p = append(p, "publish-metric.sh publishes "+got+", target-tracking.json tracks "+cm.MetricName)
	}
	if got := flag("namespace"); got != cm.Namespace {
		p = append(p, "publish-metric.sh publishes in namespace "+got+", target-tracking.json tracks "+cm.Namespace)
	}
	var published []string
	for _, d := range strings.Split(flag("dimensions"), ",") {
		if name, _, ok := strings.Cut(d, "="); ok {
			published = append(published, name)
		}
	}
	var tracked []string
	for _, d := range cm.Dimensions {
		tracked = append(tracked, d.Name)
	}
	if strings.Join(published, ",") != strings.Join(tracked, ",") {
		p = append(p, "publish-metric.sh publishes with dimensions "+strings.Join(published, ",")+", target-tracking.json tracks "+strings.Join(tracked, ","))
	}
	if !strings.Contains(s, `"`+desiredMetric+`"`) {
		p = append(p, "publish-metric.sh does not read "+desiredMetric)
	}
	// The admin API of the shipped mesh.Caddyfile, as a box without LCHAT_ADMIN_LISTEN
	// adapts it.
	cfg, err := adaptMesh(t)
	if err != nil {
		return append(p, err.Error())
	}
	if sock, ok := strings.CutPrefix(cfg.Admin.Listen, "unix/"); ok {
		sock, _, _ = strings.Cut(sock, "|")
		if !strings.Contains(s, "--unix-socket "+sock+" ") {
			p = append(p, "publish-metric.sh does not read the admin API on "+sock+", where mesh.Caddyfile serves it")
		}
	} else if !strings.Contains(s, cfg.Admin.Listen) {
		p = append(p, "publish-metric.sh does not read the admin API on "+cfg.Admin.Listen)
	}
	return p
}

func readRepo(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAWSRecipe: the target tracking policy tracks exactly the metric the publisher puts
// into CloudWatch, and the publisher reads the box's signal where the box serves it.
func TestAWSRecipe(t *testing.T) {
	for _, pr := range awsProblems(t, readRepo(t, "deploy/autoscale/aws/target-tracking.json"), readRepo(t, "deploy/autoscale/aws/publish-metric.sh")) {
		t.Error(pr)
	}
}

// TestAWSRecipeMistakes: the check fails on a typo'd field, a metric or dimension that
// differs between the two halves, and the admin API looked for on a port the box does not
// open.
func TestAWSRecipeMistakes(t *testing.T) {
	policy, script := readRepo(t, "deploy/autoscale/aws/target-tracking.json"), readRepo(t, "deploy/autoscale/aws/publish-metric.sh")
	for _, tc := range []struct {
		name, old, new, want string
		inScript             bool
	}{
		{"typo in the policy", `"TargetValue"`, `"TargetValu"`, `unknown field "TargetValu"`, false},
		{"other metric name", `"lchat_fleet_desired_boxes_per_box"`, `"lchat_desired_per_box"`, "target-tracking.json tracks lchat_desired_per_box", false},
		{"no dimensions", `"Name": "AutoScalingGroupName"`, `"Name": "GroupName"`, "dimensions", false},
		{"other namespace published", "--namespace lchat", "--namespace lchat2", "namespace lchat2", true},
		{"admin on a TCP port", "--unix-socket /run/lchat-caddy/admin.sock http://localhost/metrics", "http://localhost:2019/metrics", "does not read the admin API", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, s := policy, script
			target := &p
			if tc.inScript {
				target = &s
			}
			if !bytes.Contains(*target, []byte(tc.old)) {
				t.Fatalf("%q is not in the recipe: the case no longer applies", tc.old)
			}
			*target = bytes.Replace(*target, []byte(tc.old), []byte(tc.new), 1)
			problems := awsProblems(t, p, s)
			found := false
			for _, pr := range problems {
				found = found || strings.Contains(pr, tc.want)
			}
			if !found {
				t.Errorf("want a problem with %q, got %q", tc.want, problems)
			}
		})
	}
}

// TestNomadRecipe: the Nomad job scales on the box's signal, gives the stop the drain's
// time, and checks the box's health where lchat_health answers (HCL is read for these
// settings only).
func TestNomadRecipe(t *testing.T) {
	job := string(readRepo(t, "deploy/autoscale/nomad/lchat-caddy.nomad.hcl"))
	if !regexp.MustCompile(`query\s*=\s*"max\(` + desiredMetric + `\)"`).MatchString(job) {
		t.Errorf("the Nomad job's scaling check does not query max(%s)", desiredMetric)
	}
	m := regexp.MustCompile(`kill_timeout\s*=\s*"(\d+)s"`).FindStringSubmatch(job)
	if m == nil {
		t.Fatal("the Nomad job has no kill_timeout in seconds")
	}
	cfg, err := adaptMesh(t)
	if err != nil {
		t.Fatal(err)
	}
	drain := time.Duration(cfg.Apps.Lchat.DrainTimeout)
	if drain == 0 {
		drain = DefaultDrainTimeout
	}
	delay := time.Duration(cfg.Apps.HTTP.ShutdownDelay)
	if d := regexp.MustCompile(`LCHAT_SHUTDOWN_DELAY\s*=\s*"(\d+)s"`).FindStringSubmatch(job); d != nil {
		n, _ := strconv.Atoi(d[1])
		delay = time.Duration(n) * time.Second
	}
	stop := delay + time.Duration(cfg.Apps.HTTP.GracePeriod) + drain
	kill, _ := strconv.Atoi(m[1])
	if time.Duration(kill)*time.Second <= stop {
		t.Errorf("kill_timeout %ss: the stop may take %v", m[1], stop)
	}
	// The service's check asks lchat_health on the port the job names for it.
	_, health, ok := cfg.ServerWith("lchat_health")
	if !ok {
		t.Fatal("the box's config has no lchat_health server")
	}
	ports, _ := health.Ports()
	hp := regexp.MustCompile(`port\s+"health"\s*\{\s*static\s*=\s*(\d+)\s*\}`).FindStringSubmatch(job)
	if hp == nil {
		t.Fatal(`the Nomad job has no static port "health"`)
	}
	if n, _ := strconv.Atoi(hp[1]); !slices.Contains(ports, n) {
		t.Errorf("the job's health port %s: lchat_health listens on %v", hp[1], ports)
	}
	check := regexp.MustCompile(`(?s)check\s*\{[^}]*type\s*=\s*"http"[^}]*port\s*=\s*"health"[^}]*path\s*=\s*"([^"]*)"`).FindStringSubmatch(job)
	if check == nil {
		t.Fatal("the Nomad job's service has no HTTP check on the health port")
	}
	if !health.Serves("lchat_health", check[1]) {
		t.Errorf("the check's path %q: lchat_health does not answer it", check[1])
	}
	if regexp.MustCompile(`check_restart\s*\{`).MatchString(job) {
		t.Error("the job restarts a box whose check fails: a draining box fails it")
	}
}

// adaptMesh adapts the shipped mesh.Caddyfile as a box with only the required settings
// (its own address, the mesh domains and token) does.
func adaptMesh(t *testing.T) (Config, error) {
	return Adapt(lchatCaddy(t), filepath.Join(repoRoot, "caddyfiles/mesh.Caddyfile"), []string{
		"HOME=" + t.TempDir(), "LCHAT_MESH_SELF=https://10.0.0.5", "LCHAT_MESH_DOMAINS=spaces.example.com",
		"LCHAT_MESH_TOKEN=" + strings.Repeat("s", 40),
	})
}
