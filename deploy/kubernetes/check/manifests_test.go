// Package check decodes the Kubernetes manifests of deploy/kubernetes strictly into the
// Kubernetes API types (unknown or misspelt fields fail) and checks how they fit together.
// It is its own module so the gateway's go.mod carries no Kubernetes dependencies; run it with
// (cd deploy/kubernetes/check && go test ./...), as scripts/test.sh does.
package check

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
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
		for i, doc := range docSep.Split(string(data), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			if err := m.add([]byte(doc)); err != nil {
				t.Errorf("%s (document %d): %v", res, i+1, err)
			}
		}
	}
	return m
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

// gatewayConfig is the part of the gateway's config the manifests depend on.
type gatewayConfig struct {
	Listen      string `json:"listen"`
	AdminListen string `json:"admin_listen"`
	ClientIP    struct {
		TrustedProxies []string `json:"trusted_proxies"`
	} `json:"client_ip"`
	Server struct {
		ShutdownDelay string `json:"shutdown_delay"`
		ShutdownGrace string `json:"shutdown_grace"`
	} `json:"server"`
}

func TestBaseFitsTogether(t *testing.T) {
	m := load(t, baseDir)
	if t.Failed() || len(m.deployments) != 1 || len(m.services) != 1 || len(m.configMaps) != 1 {
		t.FailNow()
	}
	d, svc, cm := m.deployments[0], m.services[0], m.configMaps[0]
	spec := d.Spec.Template.Spec

	// The gateway's config: admin on all interfaces, and its drain fits the grace period.
	raw, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatal("ConfigMap has no config.yaml")
	}
	var cfg gatewayConfig
	if err := yaml.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("ConfigMap config.yaml: %v", err)
	}
	if !strings.HasPrefix(cfg.AdminListen, "0.0.0.0:") && !strings.HasPrefix(cfg.AdminListen, ":") {
		t.Errorf("admin_listen %q: probes and Prometheus cannot reach a loopback listener", cfg.AdminListen)
	}
	// Only the ingress controller's X-Forwarded-For is believed: a range as wide as the pod
	// network would let any pod spoof client IPs past auth.failure_limit and the per-IP limit.
	for _, p := range cfg.ClientIP.TrustedProxies {
		prefix, err := netip.ParsePrefix(p)
		if err != nil {
			if a, aerr := netip.ParseAddr(p); aerr == nil {
				prefix, err = netip.PrefixFrom(a, a.BitLen()), nil
			}
		}
		if err != nil {
			t.Errorf("client_ip.trusted_proxies: %q is not a CIDR", p)
			continue
		}
		if prefix.Bits() < 24 {
			t.Errorf("client_ip.trusted_proxies: %s is wider than a /24: trust the ingress controller's addresses only, not the pod network", p)
		}
	}
	delay, err1 := time.ParseDuration(cfg.Server.ShutdownDelay)
	grace, err2 := time.ParseDuration(cfg.Server.ShutdownGrace)
	if err1 != nil || err2 != nil {
		t.Fatalf("server.shutdown_delay/grace: %v %v", err1, err2)
	}
	if spec.TerminationGracePeriodSeconds == nil ||
		time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= delay+grace {
		t.Errorf("terminationGracePeriodSeconds must exceed shutdown_delay %s + shutdown_grace %s", delay, grace)
	}

	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("replicas: want 3")
	}
	if !selects(d.Spec.Selector, d.Spec.Template.Labels) {
		t.Errorf("Deployment selector does not select its own pods")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(spec.Containers))
	}
	c := spec.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 8080 || ports["admin"] != 9090 {
		t.Errorf("container ports: want http 8080 and admin 9090, got %v", ports)
	}
	probe := func(name string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe", name)
			return
		}
		if p.HTTPGet.Path != path || p.HTTPGet.Port != intstr.FromString("admin") {
			t.Errorf("%s: want %s on port admin, got %s on %s", name, path, p.HTTPGet.Path, p.HTTPGet.Port.String())
		}
	}
	probe("livenessProbe", c.LivenessProbe, "/healthz")
	probe("readinessProbe", c.ReadinessProbe, "/readyz")
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("resources.requests.%s missing", r)
		}
		if _, ok := c.Resources.Limits[r]; !ok {
			t.Errorf("resources.limits.%s missing", r)
		}
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Error("container securityContext missing")
	default:
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Error("allowPrivilegeEscalation must be false")
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Error("readOnlyRootFilesystem must be true")
		}
		if sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Error("capabilities must drop ALL")
		}
	}
	nonRoot := (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) ||
		(spec.SecurityContext != nil && spec.SecurityContext.RunAsNonRoot != nil && *spec.SecurityContext.RunAsNonRoot)
	if !nonRoot {
		t.Error("runAsNonRoot must be true")
	}
	// The config volume comes from the ConfigMap of the base and is mounted where the
	// image's ENTRYPOINT reads it.
	mounted := false
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			for _, vm := range c.VolumeMounts {
				if vm.Name == v.Name && vm.MountPath == "/etc/gateway" {
					mounted = true
				}
			}
		}
	}
	if !mounted {
		t.Errorf("ConfigMap %s is not mounted at /etc/gateway", cm.Name)
	}

	// Service: http 8080 and admin 9090, targeting named container ports, selecting the pods.
	svcPorts := map[string]corev1.ServicePort{}
	for _, p := range svc.Spec.Ports {
		svcPorts[p.Name] = p
		if p.TargetPort.Type == intstr.String {
			if _, ok := ports[p.TargetPort.StrVal]; !ok {
				t.Errorf("Service port %s targets unknown container port %q", p.Name, p.TargetPort.StrVal)
			}
		}
	}
	if svcPorts["http"].Port != 8080 || svcPorts["admin"].Port != 9090 {
		t.Errorf("Service ports: want http 8080 and admin 9090, got %v", svc.Spec.Ports)
	}
	if !selectsMap(svc.Spec.Selector, d.Spec.Template.Labels) {
		t.Error("Service selector does not select the Deployment's pods")
	}

	for _, p := range m.pdbs {
		if !selects(p.Spec.Selector, d.Spec.Template.Labels) {
			t.Errorf("PodDisruptionBudget %s does not select the gateway pods", p.Name)
		}
		if p.Spec.MinAvailable == nil && p.Spec.MaxUnavailable == nil {
			t.Errorf("PodDisruptionBudget %s sets neither minAvailable nor maxUnavailable", p.Name)
		}
	}
	for _, h := range m.hpas {
		ref := h.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.Name != d.Name || ref.APIVersion != "apps/v1" {
			t.Errorf("HPA %s targets %s %s/%s, not the gateway Deployment", h.Name, ref.APIVersion, ref.Kind, ref.Name)
		}
		cpu := false
		for _, mt := range h.Spec.Metrics {
			if mt.Type == autoscalingv2.ResourceMetricSourceType && mt.Resource != nil && mt.Resource.Name == corev1.ResourceCPU {
				cpu = true
			}
		}
		if !cpu {
			t.Errorf("HPA %s has no CPU metric", h.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas > h.Spec.MaxReplicas {
			t.Errorf("HPA %s: minReplicas must be set and not above maxReplicas", h.Name)
		}
	}

	for _, sm := range m.monitors {
		if !selects(&sm.Spec.Selector, svc.Labels) {
			t.Errorf("ServiceMonitor %s does not select the Service", sm.Metadata.Name)
		}
		if len(sm.Spec.Endpoints) == 0 {
			t.Errorf("ServiceMonitor %s has no endpoints", sm.Metadata.Name)
		}
		for _, ep := range sm.Spec.Endpoints {
			if _, ok := svcPorts[ep.Port]; !ok {
				t.Errorf("ServiceMonitor %s scrapes port %q, which the Service does not name", sm.Metadata.Name, ep.Port)
			}
			if ep.Port != "admin" || ep.Path != "/metrics" {
				t.Errorf("ServiceMonitor %s: want port admin path /metrics, got %q %q", sm.Metadata.Name, ep.Port, ep.Path)
			}
		}
		// alerts.yaml expects job="gateway": the operator uses the Service name unless jobLabel is set.
		if sm.Spec.JobLabel == "" && svc.Name != "gateway" {
			t.Errorf("the job label would be %q; deploy/prometheus/alerts.yaml expects gateway", svc.Name)
		}
	}
}

// The NetworkPolicy lets the ingress controller reach the public port only, and Prometheus
// the admin port only: each rule names one peer and one of the Deployment's named ports.
func TestNetworkPolicy(t *testing.T) {
	m := load(t, baseDir)
	if t.Failed() || len(m.deployments) != 1 {
		t.FailNow()
	}
	if len(m.policies) != 1 {
		t.Fatalf("want one NetworkPolicy, got %d", len(m.policies))
	}
	np, d := m.policies[0], m.deployments[0]
	if !selects(&np.Spec.PodSelector, d.Spec.Template.Labels) {
		t.Fatal("the NetworkPolicy does not select the gateway pods")
	}
	if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
		t.Fatalf("policyTypes %v, want [Ingress]", np.Spec.PolicyTypes)
	}
	containerPorts := map[string]int32{}
	for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
		containerPorts[p.Name] = p.ContainerPort
	}
	// Which port each peer may reach, by the peer's pod label.
	reach := map[string][]string{}
	for i, rule := range np.Spec.Ingress {
		if len(rule.From) != 1 || len(rule.Ports) != 1 {
			t.Fatalf("ingress[%d]: want one peer and one port, got %d and %d", i, len(rule.From), len(rule.Ports))
		}
		peer := rule.From[0]
		if peer.IPBlock != nil || peer.PodSelector == nil || peer.NamespaceSelector == nil ||
			len(peer.PodSelector.MatchLabels) == 0 || len(peer.NamespaceSelector.MatchLabels) == 0 {
			t.Fatalf("ingress[%d]: the peer must name both a namespace and pods (an empty selector lets everybody in)", i)
		}
		port := rule.Ports[0]
		if port.Port == nil || port.Port.Type != intstr.String || containerPorts[port.Port.StrVal] == 0 {
			t.Fatalf("ingress[%d]: port %v is not a named port of the gateway container", i, port.Port)
		}
		name := peer.PodSelector.MatchLabels["app.kubernetes.io/name"]
		reach[name] = append(reach[name], port.Port.StrVal)
	}
	if strings.Join(reach["ingress-nginx"], ",") != "http" || strings.Join(reach["prometheus"], ",") != "admin" || len(reach) != 2 {
		t.Fatalf("who reaches what: %v; want the ingress controller on http only and Prometheus on admin only", reach)
	}
}

// selects reports whether a label selector with only matchLabels selects labels.
func selects(sel *metav1.LabelSelector, labels map[string]string) bool {
	if sel == nil || len(sel.MatchExpressions) > 0 {
		return false
	}
	return selectsMap(sel.MatchLabels, labels)
}

func selectsMap(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}
