// Package deploycheck reads the deployment recipes under deploy/ the way the systems that
// run them do: Kubernetes manifests decoded strictly into the API's own types (a field the
// API does not have is an error, as kubectl's server-side validation makes it), and the
// box's Caddyfile adapted by lchat-caddy itself, so that the tests beside it can hold the
// recipes to the ports, paths, metric names and stop times the box really has.
package deploycheck

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Documents splits a multi-document YAML file into its documents, leaving out empty ones
// (a file that starts with ---, comments alone).
func Documents(data []byte) ([][]byte, error) {
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("splitting documents: %v", err)
		}
		var probe map[string]any
		if err := yaml.Unmarshal(doc, &probe); err != nil {
			return nil, fmt.Errorf("document %d: %v", len(docs)+1, err)
		}
		if len(probe) > 0 {
			docs = append(docs, doc)
		}
	}
}

// kinds are the API types a recipe may hold, by apiVersion and kind.
var kinds = map[string]func() any{
	"apps/v1 Deployment":                     func() any { return new(appsv1.Deployment) },
	"apps/v1 StatefulSet":                    func() any { return new(appsv1.StatefulSet) },
	"autoscaling/v2 HorizontalPodAutoscaler": func() any { return new(autoscalingv2.HorizontalPodAutoscaler) },
	"v1 Service":                             func() any { return new(corev1.Service) },
	"v1 ConfigMap":                           func() any { return new(corev1.ConfigMap) },
	"v1 Secret":                              func() any { return new(corev1.Secret) },
	"policy/v1 PodDisruptionBudget":          func() any { return new(policyv1.PodDisruptionBudget) },
}

// Decode decodes one manifest document strictly into its API type (a *appsv1.Deployment,
// a *autoscalingv2.HorizontalPodAutoscaler, ...): a field the type lacks, a field given
// twice or a value of the wrong type is an error, and so is an apiVersion and kind not
// listed in kinds.
func Decode(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, fmt.Errorf("reading apiVersion and kind: %v", err)
	}
	mk, ok := kinds[tm.APIVersion+" "+tm.Kind]
	if !ok {
		return nil, fmt.Errorf("apiVersion %q kind %q: not a type this check knows", tm.APIVersion, tm.Kind)
	}
	obj := mk()
	if err := Strict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: %v", tm.Kind, err)
	}
	return obj, nil
}

// Strict decodes YAML into v as the API server's strict field validation does: a field v
// lacks, or a key given twice, is an error naming its path ("unknown field
// \"spec.template.spec.foo\"").
func Strict(doc []byte, v any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strictErrs, err := sigsjson.UnmarshalStrict(js, v)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// DecodeFile decodes every document of a manifest file (Decode).
func DecodeFile(data []byte) ([]any, error) {
	docs, err := Documents(data)
	if err != nil {
		return nil, err
	}
	var out []any
	for i, d := range docs {
		obj, err := Decode(d)
		if err != nil {
			return nil, fmt.Errorf("document %d: %v", i+1, err)
		}
		out = append(out, obj)
	}
	return out, nil
}

// Config is what the checks read of a box's adapted (JSON) config.
type Config struct {
	Admin struct {
		Listen string `json:"listen"`
	} `json:"admin"`
	Apps struct {
		HTTP struct {
			ShutdownDelay Duration          `json:"shutdown_delay"`
			GracePeriod   Duration          `json:"grace_period"`
			Servers       map[string]Server `json:"servers"`
		} `json:"http"`
		Lchat struct {
			DrainTimeout Duration `json:"drain_timeout"`
		} `json:"lchat"`
	} `json:"apps"`
}

// DefaultDrainTimeout is the lchat app's drain_timeout when the config sets none.
const DefaultDrainTimeout = 60 * time.Second

// Server is one HTTP server of the adapted config.
type Server struct {
	Listen []string `json:"listen"`
	Routes []Route  `json:"routes"`
}

// Route is one route of a server: its matchers and handlers.
type Route struct {
	Match []struct {
		Path []string `json:"path"`
	} `json:"match"`
	Handle []struct {
		Handler string `json:"handler"`
	} `json:"handle"`
}

// Duration is a caddy.Duration as adapted JSON writes it: nanoseconds, or a Go duration
// string.
type Duration time.Duration

// UnmarshalJSON reads either form.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if s, err := strconv.Unquote(string(b)); err == nil {
		v, err := time.ParseDuration(s)
		*d = Duration(v)
		return err
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	*d = Duration(n)
	return err
}

// Adapt runs `lchat-caddy adapt` (bin) on caddyfile with env as its whole environment, as
// a box does at start (the {$VAR:default} placeholders are read then), and decodes what the
// checks need of the JSON.
func Adapt(bin, caddyfile string, env []string) (Config, error) {
	cmd := exec.Command(bin, "adapt", "--config", caddyfile, "--adapter", "caddyfile")
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return Config{}, fmt.Errorf("adapting %s: %v: %s", caddyfile, err, stderr.Bytes())
	}
	var c Config
	if err := json.Unmarshal(out, &c); err != nil {
		return Config{}, fmt.Errorf("reading the adapted config: %v", err)
	}
	return c, nil
}

// ServerWith is the name and server whose routes use handler; ok false when none does.
func (c Config) ServerWith(handler string) (string, Server, bool) {
	for name, s := range c.Apps.HTTP.Servers {
		for _, r := range s.Routes {
			for _, h := range r.Handle {
				if h.Handler == handler {
					return name, s, true
				}
			}
		}
	}
	return "", Server{}, false
}

// Ports are the ports the server listens on.
func (s Server) Ports() ([]int, error) {
	var ports []int
	for _, l := range s.Listen {
		_, p, err := net.SplitHostPort(strings.TrimPrefix(l, "tcp/"))
		if err != nil {
			return nil, fmt.Errorf("listen %q: %v", l, err)
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("listen %q: a port range is not a port", l)
		}
		ports = append(ports, n)
	}
	return ports, nil
}

// Serves reports whether a request for path reaches handler on s: some route using it
// has no path matcher, or one that matches path (exactly, or a prefix ending in *).
func (s Server) Serves(handler, path string) bool {
	for _, r := range s.Routes {
		uses := false
		for _, h := range r.Handle {
			uses = uses || h.Handler == handler
		}
		if !uses {
			continue
		}
		if len(r.Match) == 0 {
			return true
		}
		for _, m := range r.Match {
			if len(m.Path) == 0 {
				return true
			}
			for _, p := range m.Path {
				if p == path || (strings.HasSuffix(p, "*") && strings.HasPrefix(path, strings.TrimSuffix(p, "*"))) {
					return true
				}
			}
		}
	}
	return false
}
