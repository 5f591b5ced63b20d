// Package check decodes the Kubernetes manifests of the kustomize base (deploy/kubernetes/base)
// and of the Helm chart (deploy/helm/gateway, rendered by Helm's own Go module) strictly into
// the Kubernetes API types (unknown or misspelt fields fail), and runs the same checks of how
// they fit together on both (checks_test.go). The gateway config they carry is loaded with the
// gateway's own config package. It is its own module so the gateway's go.mod carries no
// Kubernetes or Helm dependencies; run it with (cd deploy/kubernetes/check && go test ./...),
// as scripts/test.sh does.
package check

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const baseDir = "../base"

// kustomization is the part of kustomize's Kustomization the base uses; a field outside it
// fails the strict decode (add it here when the base starts using it).
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// serviceMonitor is checked by hand: its types live in prometheus-operator.
type serviceMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		JobLabel  string               `json:"jobLabel,omitempty"`
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			Authorization *struct {
				Type        string                   `json:"type"`
				Credentials corev1.SecretKeySelector `json:"credentials"`
			} `json:"authorization,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type manifests struct {
	configMaps  []*corev1.ConfigMap
	secrets     []*corev1.Secret
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	pdbs        []*policyv1.PodDisruptionBudget
	hpas        []*autoscalingv2.HorizontalPodAutoscaler
	monitors    []*serviceMonitor
	policies    []*networkingv1.NetworkPolicy
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// load decodes every resource of the kustomization at dir strictly.
func load(t *testing.T, dir string) *manifests {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(raw, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Fatalf("kustomization.yaml: apiVersion/kind %s/%s", k.APIVersion, k.Kind)
	}
	if len(k.Resources) == 0 {
		t.Fatal("kustomization.yaml lists no resources")
	}
	m := &manifests{}
	for _, res := range k.Resources {
		path := filepath.Join(dir, res)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("kustomization.yaml resource %q: %v", res, err)
			continue
		}
		m.addDocs(t, res, string(data))
	}
	return m
}

// addDocs decodes every document of a multi-document YAML file strictly.
func (m *manifests) addDocs(t testing.TB, name, data string) {
	t.Helper()
	for i, doc := range docSep.Split(data, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		if err := m.add([]byte(doc)); err != nil {
			t.Errorf("%s (document %d): %v", name, i+1, err)
		}
	}
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func (m *manifests) add(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	strict := func(into any) error { return yaml.UnmarshalStrict(doc, into) }
	switch tm.APIVersion + " " + tm.Kind {
	case "v1 ConfigMap":
		o := &corev1.ConfigMap{}
		m.configMaps = append(m.configMaps, o)
		return strict(o)
	case "v1 Secret":
		o := &corev1.Secret{}
		m.secrets = append(m.secrets, o)
		return strict(o)
	case "apps/v1 Deployment":
		o := &appsv1.Deployment{}
		m.deployments = append(m.deployments, o)
		return strict(o)
	case "v1 Service":
		o := &corev1.Service{}
		m.services = append(m.services, o)
		return strict(o)
	case "policy/v1 PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		m.pdbs = append(m.pdbs, o)
		return strict(o)
	case "autoscaling/v2 HorizontalPodAutoscaler":
		o := &autoscalingv2.HorizontalPodAutoscaler{}
		m.hpas = append(m.hpas, o)
		return strict(o)
	case "networking.k8s.io/v1 NetworkPolicy":
		o := &networkingv1.NetworkPolicy{}
		m.policies = append(m.policies, o)
		return strict(o)
	case "monitoring.coreos.com/v1 ServiceMonitor":
		o := &serviceMonitor{}
		m.monitors = append(m.monitors, o)
		return strict(o)
	}
	return fmt.Errorf("unexpected apiVersion/kind %q %q: add a strict decoder for it", tm.APIVersion, tm.Kind)
}

func TestStrictDecode(t *testing.T) {
	m := load(t, baseDir)
	if len(m.configMaps) != 1 || len(m.deployments) != 1 || len(m.services) != 1 ||
		len(m.pdbs) != 1 || len(m.hpas) != 1 || len(m.monitors) != 1 {
		t.Fatalf("want one each of ConfigMap, Deployment, Service, PDB, HPA, ServiceMonitor; got %d %d %d %d %d %d",
			len(m.configMaps), len(m.deployments), len(m.services), len(m.pdbs), len(m.hpas), len(m.monitors))
	}
}

// TestStrictDecodeRejectsTypos makes sure the decoder would catch a misspelt field.
func TestStrictDecodeRejectsTypos(t *testing.T) {
	m := &manifests{}
	doc := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 3\n"
	if err := m.add([]byte(doc)); err == nil {
		t.Fatal("spec.replica (typo) was accepted")
	}
}

// TestBaseFitsTogether runs the checks of checks_test.go on the kustomize base; helm_test.go
// runs the same on the rendered chart.
func TestBaseFitsTogether(t *testing.T) {
	m := load(t, baseDir)
	if t.Failed() {
		t.FailNow()
	}
	checkFitsTogether(t, m)
}

func TestNetworkPolicy(t *testing.T) {
	m := load(t, baseDir)
	if t.Failed() {
		t.FailNow()
	}
	checkNetworkPolicy(t, m)
}
