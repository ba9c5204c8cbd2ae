package deploycheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

const (
	kubeDir = "deploy/autoscale/kubernetes"
	// desiredMetric is the autoscaling signal every box publishes (docs/operations.md,
	// "Capacity and autoscaling").
	desiredMetric = "lchat_fleet_desired_boxes"
	// imageCaddyfiles is where the recipes say the image holds the shipped caddyfiles/.
	imageCaddyfiles = "/etc/lchat/"
)

// kube is the decoded Kubernetes recipe.
type kube struct {
	deploy  *appsv1.Deployment
	hpa     *autoscalingv2.HorizontalPodAutoscaler
	configs map[string]*corev1.ConfigMap
}

// readKube decodes every manifest of the recipe strictly, from files (name -> content).
func readKube(files map[string][]byte) (kube, error) {
	k := kube{configs: map[string]*corev1.ConfigMap{}}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		objs, err := DecodeFile(files[n])
		if err != nil {
			return k, fmt.Errorf("%s: %v", n, err)
		}
		for _, o := range objs {
			switch o := o.(type) {
			case *appsv1.Deployment:
				k.deploy = o
			case *autoscalingv2.HorizontalPodAutoscaler:
				k.hpa = o
			case *corev1.ConfigMap:
				k.configs[o.Name] = o
			}
		}
	}
	if k.deploy == nil || k.hpa == nil {
		return k, fmt.Errorf("the recipe needs a Deployment and a HorizontalPodAutoscaler")
	}
	return k, nil
}

func readDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	paths, err := filepath.Glob(filepath.Join(repoRoot, dir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = b
	}
	return files
}

// adaptCache holds adapted configs by the Caddyfile and environment they came from: the
// mutation cases change the manifests, rarely the Caddyfile.
var adaptCache = map[string]Config{}

// boxConfig adapts the box's Caddyfile as the Deployment runs it: the ConfigMap mounted at
// the --config path, importing the shipped caddyfiles/ from where the image holds them,
// with the container's environment.
func boxConfig(t *testing.T, k kube, c corev1.Container) (Config, []string) {
	var problems []string
	cfgPath := ""
	for i, a := range c.Args {
		if a == "--config" && i+1 < len(c.Args) {
			cfgPath = c.Args[i+1]
		}
	}
	if len(c.Args) == 0 || c.Args[0] != "run" || cfgPath == "" {
		return Config{}, []string{fmt.Sprintf("container args %q: want run --config <path>", c.Args)}
	}
	var text string
	found := false
	for _, m := range c.VolumeMounts {
		key, ok := strings.CutPrefix(cfgPath, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range k.deploy.Spec.Template.Spec.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			cm := k.configs[v.ConfigMap.Name]
			if cm == nil {
				return Config{}, []string{fmt.Sprintf("volume %s: no ConfigMap %s in the recipe", v.Name, v.ConfigMap.Name)}
			}
			text, found = cm.Data[key]
		}
	}
	if !found {
		return Config{}, []string{fmt.Sprintf("--config %s: no ConfigMap key mounted there", cfgPath)}
	}
	env, envProblems := containerEnv(c)
	problems = append(problems, envProblems...)
	cacheKey := text + "\x00" + strings.Join(env, "\x00")
	if cfg, ok := adaptCache[cacheKey]; ok {
		return cfg, problems
	}
	// The shipped Caddyfiles where the image holds them, the ConfigMap's beside them.
	dir := t.TempDir()
	src := filepath.Join(repoRoot, "caddyfiles")
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(text, "import "+imageCaddyfiles+"mesh.Caddyfile") {
		problems = append(problems, fmt.Sprintf("the ConfigMap's Caddyfile does not import %smesh.Caddyfile, the shipped box", imageCaddyfiles))
	}
	text = strings.ReplaceAll(text, imageCaddyfiles, dir+"/")
	file := filepath.Join(dir, "k8s.Caddyfile")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Adapt(lchatCaddy(t), file, append(env, "HOME="+dir))
	if err != nil {
		return Config{}, append(problems, err.Error())
	}
	adaptCache[cacheKey] = cfg
	return cfg, problems
}

// containerEnv is the container's environment as the kubelet gives it: $(VAR) expanded
// from the variables before it; a secret and the pod's IP stand in with example values.
func containerEnv(c corev1.Container) ([]string, []string) {
	var env, problems []string
	vals := map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.SecretKeyRef != nil:
			v = strings.Repeat("s", 40)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			v = "10.0.0.5"
		default:
			problems = append(problems, fmt.Sprintf("env %s: a source this check does not know", e.Name))
		}
		v = ref.ReplaceAllStringFunc(v, func(m string) string {
			if x, ok := vals[m[2:len(m)-1]]; ok {
				return x
			}
			return m
		})
		vals[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return env, problems
}

// kubeProblems checks what an operator relies on in the recipe; it returns what is wrong.
func kubeProblems(t *testing.T, files map[string][]byte) []string {
	k, err := readKube(files)
	if err != nil {
		return []string{err.Error()}
	}
	var p []string
	bad := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	d := k.deploy
	pod := d.Spec.Template

	if d.Spec.Selector == nil || len(d.Spec.Selector.MatchLabels) == 0 {
		bad("Deployment %s: no selector", d.Name)
	} else {
		for l, v := range d.Spec.Selector.MatchLabels {
			if pod.Labels[l] != v {
				bad("Deployment %s: the selector %s=%s does not select its own pods (%v)", d.Name, l, v, pod.Labels)
			}
		}
	}
	if len(pod.Spec.Containers) != 1 {
		bad("Deployment %s: want one container (the box), got %d", d.Name, len(pod.Spec.Containers))
		return p
	}
	c := pod.Spec.Containers[0]
	if c.Resources.Limits.Memory().IsZero() {
		bad("container %s: no memory limit: the box's default memory budget is read from it", c.Name)
	}
	cfg, cp := boxConfig(t, k, c)
	p = append(p, cp...)
	if len(cp) > 0 {
		return p
	}

	// Ports: every port the container declares is one the box listens on, and the box's
	// TLS listener, health check and metrics are declared.
	listened := map[int]string{}
	for name, s := range cfg.Apps.HTTP.Servers {
		ports, err := s.Ports()
		if err != nil {
			bad("server %s: %v", name, err)
		}
		for _, port := range ports {
			listened[port] = name
		}
	}
	declared := map[string]int{}
	for _, cport := range c.Ports {
		declared[cport.Name] = int(cport.ContainerPort)
		if _, ok := listened[int(cport.ContainerPort)]; !ok {
			bad("container port %s %d: the box listens on none such (it listens on %v)", cport.Name, cport.ContainerPort, keys(listened))
		}
	}
	portOf := func(ps string) int {
		if n, err := strconv.Atoi(ps); err == nil {
			return n
		}
		if n, ok := declared[ps]; ok {
			return n
		}
		bad("port %q: no container port of that name", ps)
		return -1
	}
	_, health, ok := cfg.ServerWith("lchat_health")
	if !ok {
		bad("the box's config has no lchat_health server")
	}
	healthPorts, _ := health.Ports()
	_, metrics, ok := cfg.ServerWith("metrics")
	if !ok {
		bad("the box's config serves no metrics handler for Prometheus (the admin API is on a Unix socket)")
	}
	metricsPorts, _ := metrics.Ports()
	for _, want := range []struct {
		what  string
		ports []int
	}{{"the health check", healthPorts}, {"the metrics", metricsPorts}, {"HTTPS", []int{443}}} {
		if !slices.ContainsFunc(want.ports, func(n int) bool { return slices.Contains(slices.Collect(mapValues(declared)), n) }) {
			bad("no container port for %s (%v)", want.what, want.ports)
		}
	}

	// The readiness probe asks lchat_health, which fails from the first moment of a stop;
	// a liveness probe there would restart a draining box.
	rp := c.ReadinessProbe
	if rp == nil || rp.HTTPGet == nil {
		bad("container %s: no HTTP readiness probe", c.Name)
	} else {
		port := portOf(rp.HTTPGet.Port.String())
		if !slices.Contains(healthPorts, port) {
			bad("readiness probe on port %d: lchat_health listens on %v", port, healthPorts)
		}
		if !health.Serves("lchat_health", rp.HTTPGet.Path) {
			bad("readiness probe path %q: lchat_health does not answer it", rp.HTTPGet.Path)
		}
		// Counted unready before the listeners close: periodSeconds × failureThreshold
		// (defaults 10 and 3) within LCHAT_SHUTDOWN_DELAY.
		period, fails := orDefault(&rp.PeriodSeconds, 10), orDefault(&rp.FailureThreshold, 3)
		if unready := time.Duration(period*fails) * time.Second; unready >= time.Duration(cfg.Apps.HTTP.ShutdownDelay) {
			bad("the readiness probe counts a stopping box unready after %v, not before its listeners close (shutdown_delay %v)", unready, time.Duration(cfg.Apps.HTTP.ShutdownDelay))
		}
	}
	if lp := c.LivenessProbe; lp != nil && lp.HTTPGet != nil && slices.Contains(healthPorts, portOf(lp.HTTPGet.Port.String())) {
		bad("liveness probe on lchat_health: a draining box answers 503 and would be restarted")
	}

	// Prometheus scrapes the metrics site.
	ann := pod.Annotations
	if n, _ := strconv.Atoi(ann["prometheus.io/port"]); !slices.Contains(metricsPorts, n) {
		bad("prometheus.io/port %q: the metrics handler listens on %v", ann["prometheus.io/port"], metricsPorts)
	}
	if path := ann["prometheus.io/path"]; !metrics.Serves("metrics", path) {
		bad("prometheus.io/path %q: the metrics handler does not answer it", path)
	}

	// The stop: the preStop wait, then the box's shutdown delay, grace period and drain.
	preStop := time.Duration(0)
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		h := c.Lifecycle.PreStop
		switch {
		case h.Sleep != nil:
			preStop = time.Duration(h.Sleep.Seconds) * time.Second
		case h.Exec != nil && len(h.Exec.Command) == 2 && h.Exec.Command[0] == "sleep":
			n, err := strconv.Atoi(h.Exec.Command[1])
			if err != nil {
				bad("preStop %q: want sleep <seconds>", h.Exec.Command)
			}
			preStop = time.Duration(n) * time.Second
		default:
			bad("preStop: want a sleep (leave the endpoints before the drain)")
		}
	} else {
		bad("container %s: no preStop wait: the endpoints may still send clients when the box stops", c.Name)
	}
	drain := time.Duration(cfg.Apps.Lchat.DrainTimeout)
	if drain == 0 {
		drain = DefaultDrainTimeout
	}
	stop := preStop + time.Duration(cfg.Apps.HTTP.ShutdownDelay) + time.Duration(cfg.Apps.HTTP.GracePeriod) + drain
	grace := time.Duration(orDefault(pod.Spec.TerminationGracePeriodSeconds, 30)) * time.Second
	if grace <= stop {
		bad("terminationGracePeriodSeconds %v: the stop may take %v (preStop %v, shutdown_delay %v, grace_period %v, drain_timeout %v); the kubelet kills the box mid-drain",
			grace, stop, preStop, time.Duration(cfg.Apps.HTTP.ShutdownDelay), time.Duration(cfg.Apps.HTTP.GracePeriod), drain)
	}

	// The HPA scales this Deployment on the fleet's signal, one box per unit.
	h := k.hpa
	if ref := h.Spec.ScaleTargetRef; ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != d.Name {
		bad("HPA %s targets %s %s %s, not the Deployment %s", h.Name, ref.APIVersion, ref.Kind, ref.Name, d.Name)
	}
	if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 1 || *h.Spec.MinReplicas > h.Spec.MaxReplicas {
		bad("HPA %s: minReplicas %v, maxReplicas %d", h.Name, h.Spec.MinReplicas, h.Spec.MaxReplicas)
	}
	var ext *autoscalingv2.ExternalMetricSource
	for _, m := range h.Spec.Metrics {
		if m.Type == autoscalingv2.ExternalMetricSourceType && m.External != nil && m.External.Metric.Name == desiredMetric {
			ext = m.External
		}
	}
	switch {
	case ext == nil:
		bad("HPA %s: no External metric %s", h.Name, desiredMetric)
	case ext.Target.Type != autoscalingv2.AverageValueMetricType || ext.Target.AverageValue == nil ||
		ext.Target.AverageValue.Cmp(resource.MustParse("1")) != 0:
		bad("HPA %s: %s wants an AverageValue target of 1 per pod (the fleet's count over the pods), got %s %v", h.Name, desiredMetric, ext.Target.Type, ext.Target.AverageValue)
	}

	// The adapter serves that external metric from the series the boxes publish.
	served := false
	for name, cm := range k.configs {
		raw, ok := cm.Data["config.yaml"]
		if !ok {
			continue
		}
		var ac adapterConfig
		if err := Strict([]byte(raw), &ac); err != nil {
			bad("ConfigMap %s config.yaml (prometheus-adapter): %v", name, err)
			continue
		}
		for _, r := range ac.ExternalRules {
			if r.Name.As == desiredMetric && strings.Contains(r.SeriesQuery, desiredMetric) && strings.Contains(r.MetricsQuery, desiredMetric) {
				served = true
			}
		}
	}
	if !served {
		bad("no prometheus-adapter externalRule serves %s from the boxes' series", desiredMetric)
	}
	return p
}

// adapterConfig is prometheus-adapter's rule file, as much of it as the recipe may use.
type adapterConfig struct {
	Rules         []adapterRule `json:"rules,omitempty"`
	ExternalRules []adapterRule `json:"externalRules,omitempty"`
}

type adapterRule struct {
	SeriesQuery   string `json:"seriesQuery"`
	SeriesFilters []any  `json:"seriesFilters,omitempty"`
	Resources     struct {
		Overrides  map[string]any `json:"overrides,omitempty"`
		Template   string         `json:"template,omitempty"`
		Namespaced *bool          `json:"namespaced,omitempty"`
	} `json:"resources"`
	Name struct {
		Matches string `json:"matches,omitempty"`
		As      string `json:"as,omitempty"`
	} `json:"name"`
	MetricsQuery string `json:"metricsQuery"`
}

func orDefault[T ~int32 | ~int64](p *T, def int) int {
	if p == nil || *p == 0 {
		return def
	}
	return int(*p)
}

func keys[V any](m map[int]V) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func mapValues(m map[string]int) func(func(int) bool) {
	return func(yield func(int) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// TestKubernetesRecipe: the shipped manifests decode strictly into the Kubernetes API's
// types and hold what an operator relies on: the HPA scales the Deployment on
// lchat_fleet_desired_boxes, the readiness probe asks the box's lchat_health port, the
// container ports are the ones the box's Caddyfile listens on, Prometheus finds the
// metrics, and the stop gives the drain its time.
func TestKubernetesRecipe(t *testing.T) {
	for _, pr := range kubeProblems(t, readDir(t, kubeDir)) {
		t.Error(pr)
	}
}

// TestKubernetesRecipeMistakes: the check catches what a hand edit gets wrong: a typo'd
// field anywhere, a probe on the wrong port or path, a grace period shorter than the stop,
// a metric renamed on one side.
func TestKubernetesRecipeMistakes(t *testing.T) {
	files := readDir(t, kubeDir)
	const deploy, adapter = "lchat-caddy.yaml", "prometheus-adapter.yaml"
	for _, tc := range []struct {
		name, file, old, new, want string
	}{
		{"typo in the pod spec", deploy, "terminationGracePeriodSeconds:", "terminationGracePeriodSecond:", `unknown field "spec.template.spec.terminationGracePeriodSecond"`},
		{"typo in the probe", deploy, "failureThreshold:", "failureTreshold:", `unknown field "spec.template.spec.containers[0].readinessProbe.failureTreshold"`},
		{"typo in the HPA", deploy, "averageValue:", "avergeValue:", `unknown field "spec.metrics[0].external.target.avergeValue"`},
		{"typo in the ConfigMap", deploy, "\ndata:\n  Caddyfile", "\ndat:\n  Caddyfile", `unknown field "dat"`},
		{"typo in the adapter rule", adapter, "metricsQuery:", "metricQuery:", `unknown field "externalRules[0].metricQuery"`}, {"key given twice", deploy, "replicas: 2", "replicas: 2\n  replicas: 3", `key "replicas" already set`},
		{"wrong type", deploy, "replicas: 2", "replicas: two", "cannot unmarshal"},
		{"probe on the HTTPS port", deploy, "port: health", "port: https", "readiness probe on port 443"},
		{"health port moved in the env only", deploy, "value: \"8081\"", "value: \"8082\"", "container port health 8081"},
		{"grace period shorter than the stop", deploy, "terminationGracePeriodSeconds: 120", "terminationGracePeriodSeconds: 60", "the kubelet kills the box mid-drain"},
		{"probe slower than the shutdown delay", deploy, "periodSeconds: 2", "periodSeconds: 5", "not before its listeners close"},
		{"HPA on another metric", deploy, "name: " + desiredMetric, "name: lchat_desired_boxes", "no External metric"},
		{"adapter serves another name", adapter, "as: " + desiredMetric, "as: lchat_desired_boxes", "no prometheus-adapter externalRule"},
		{"scrape on the admin port", deploy, `prometheus.io/port: "9180"`, `prometheus.io/port: "2019"`, `prometheus.io/port "2019"`},
		{"no memory limit", deploy, "limits:\n              memory: 8Gi", "limits: {}", "no memory limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed := false
			mut := map[string][]byte{}
			for n, b := range files {
				mut[n] = b
			}
			for _, f := range strings.Split(tc.file, "|") {
				if s := string(files[f]); strings.Contains(s, tc.old) {
					mut[f] = []byte(strings.Replace(s, tc.old, tc.new, 1))
					changed = true
				}
			}
			if !changed {
				t.Fatalf("%q is in none of %s: the case no longer applies to the recipe", tc.old, tc.file)
			}
			problems := kubeProblems(t, mut)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("want a problem with %q, got %q", tc.want, problems)
			}
		})
	}
}

// TestBoxPublishesTheSignal: the metric the recipes scale on is the one the box registers
// and the operations guide documents.
func TestBoxPublishesTheSignal(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(repoRoot, "modules/lchat/mesh_metrics.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), `prometheus.NewDesc("`+desiredMetric+`"`) {
		t.Errorf("modules/lchat/mesh_metrics.go registers no %s", desiredMetric)
	}
	ops, err := os.ReadFile(filepath.Join(repoRoot, "docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{desiredMetric, "kubernetes/lchat-caddy.yaml", "aws/target-tracking.json", "aws/publish-metric.sh"} {
		if !strings.Contains(string(ops), s) {
			t.Errorf("docs/operations.md does not mention %s", s)
		}
	}
}
