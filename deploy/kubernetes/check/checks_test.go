package check

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/docsgate/gateway/config"
)

// The checks below run on the kustomize base (manifests_test.go) and on every rendering of
// the Helm chart (helm_test.go). They report through reporter, the part of *testing.T they
// use, so TestChecksCatch can run them on broken manifests and read what they say.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// The ports the image, the probes, the alerts and the docs agree on.
const (
	httpPort  = 8080
	adminPort = 9090
)

// checkFitsTogether: the Deployment, its config, Secrets, Services, PodDisruptionBudgets,
// HPAs and ServiceMonitors fit together and keep the gateway's security and drain settings.
func checkFitsTogether(r reporter, m *manifests) {
	r.Helper()
	if len(m.deployments) != 1 || len(m.configMaps) != 1 || len(m.services) == 0 {
		r.Errorf("want one Deployment, one ConfigMap and a Service at least; got %d, %d and %d",
			len(m.deployments), len(m.configMaps), len(m.services))
		return
	}
	d := m.deployments[0]
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		r.Errorf("want one container, got %d", len(spec.Containers))
		return
	}
	c := spec.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != httpPort || ports["admin"] != adminPort {
		r.Errorf("container ports: want http %d and admin %d, got %v", httpPort, adminPort, ports)
	}
	if cfg := checkConfig(r, m, c); cfg != nil {
		checkConfigFitsPod(r, cfg, spec, ports)
	}
	checkPod(r, m, d)
	checkSecretHygiene(r, m, c)
	checkServices(r, m, d, ports)
	checkServiceMonitors(r, m, c)
}

// checkConfig loads the ConfigMap's config.yaml with the gateway's own config package, as the
// gateway does at start: once as it stands (it must hold no secret) and once with the
// container's environment applied (the admin token must then be set). It returns the latter.
func checkConfig(r reporter, m *manifests, c corev1.Container) *config.Config {
	r.Helper()
	cm := m.configMaps[0]
	raw, ok := cm.Data["config.yaml"]
	if !ok {
		r.Errorf("ConfigMap %s has no config.yaml", cm.Name)
		return nil
	}
	mounted := false
	for _, v := range m.deployments[0].Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			for _, vm := range c.VolumeMounts {
				// The image's ENTRYPOINT reads /etc/gateway/config.yaml.
				mounted = mounted || vm.Name == v.Name && vm.MountPath == "/etc/gateway"
			}
		}
	}
	if !mounted {
		r.Errorf("ConfigMap %s is not mounted at /etc/gateway", cm.Name)
	}
	bare, err := config.Parse(strings.NewReader(raw), func(string) (string, bool) { return "", false })
	if err != nil {
		r.Errorf("ConfigMap %s config.yaml does not load: %v", cm.Name, err)
		return nil
	}
	if bare.AdminToken != "" {
		r.Errorf("ConfigMap %s holds admin_token: the token belongs in a Secret (GATEWAY_ADMIN_TOKEN)", cm.Name)
	}
	if bare.Redis.Password != "" {
		r.Errorf("ConfigMap %s holds redis.password: the password belongs in a Secret (REDIS_PASSWORD)", cm.Name)
	}
	env := containerEnv(r, m, c)
	cfg, err := config.Parse(strings.NewReader(raw), func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	})
	if err != nil {
		r.Errorf("ConfigMap %s config.yaml with the container's environment does not load: %v", cm.Name, err)
		return nil
	}
	// The admin listener is reachable from the pod network: without a token its read
	// endpoints would be open to every pod the NetworkPolicy lets in.
	if cfg.AdminToken == "" {
		r.Errorf("no admin token: set GATEWAY_ADMIN_TOKEN from a Secret")
	}
	return cfg
}

// containerEnv is the environment the gateway container starts with: literal values, and the
// values of the rendered Secrets it references. A Secret the manifests do not hold (made by
// the operator, as the base expects) gives a placeholder long enough for an admin token.
func containerEnv(r reporter, m *manifests, c corev1.Container) map[string]string {
	r.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s := findSecret(m, ref.Name)
			if s == nil {
				env[e.Name] = fmt.Sprintf("external-secret-%s-%s", ref.Name, ref.Key)
				continue
			}
			v, ok := secretValue(s, ref.Key)
			if !ok {
				if ref.Optional == nil || !*ref.Optional {
					r.Errorf("env %s: Secret %s has no key %q", e.Name, ref.Name, ref.Key)
				}
				continue
			}
			env[e.Name] = v
		}
	}
	return env
}

func findSecret(m *manifests, name string) *corev1.Secret {
	for _, s := range m.secrets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

func secretValue(s *corev1.Secret, key string) (string, bool) {
	if v, ok := s.StringData[key]; ok {
		return v, true
	}
	v, ok := s.Data[key]
	return string(v), ok
}

// checkConfigFitsPod: the config listens where the pod's ports and probes point, drains
// within the grace period, and believes X-Forwarded-For from a narrow range only.
func checkConfigFitsPod(r reporter, cfg *config.Config, spec corev1.PodSpec, ports map[string]int32) {
	r.Helper()
	for _, l := range []struct{ key, addr, port string }{
		{"listen", cfg.Listen, "http"},
		{"admin_listen", cfg.AdminListen, "admin"},
	} {
		host, port, err := net.SplitHostPort(l.addr)
		if err != nil {
			r.Errorf("%s %q: %v", l.key, l.addr, err)
			continue
		}
		if n, _ := strconv.Atoi(port); int32(n) != ports[l.port] {
			r.Errorf("%s %q: the container port %s is %d", l.key, l.addr, l.port, ports[l.port])
		}
		if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
			r.Errorf("%s %q: the kubelet's probes and Prometheus connect to the pod IP, not to its loopback", l.key, l.addr)
		}
	}
	// Only the ingress controller's X-Forwarded-For is believed: a range as wide as the pod
	// network would let any pod spoof client IPs past auth.failure_limit and the per-IP limit.
	for _, p := range cfg.ClientIP.TrustedProxies {
		prefix, err := config.ParsePrefix(p)
		if err != nil {
			r.Errorf("client_ip.trusted_proxies: %q: %v", p, err)
			continue
		}
		if prefix.Bits() < 24 {
			r.Errorf("client_ip.trusted_proxies: %s is wider than a /24: trust the ingress controller's addresses only, not the pod network", p)
		}
	}
	drain := cfg.Server.ShutdownDelay + cfg.Server.ShutdownGrace
	if spec.TerminationGracePeriodSeconds == nil ||
		time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= drain {
		r.Errorf("terminationGracePeriodSeconds must exceed server.shutdown_delay %s + server.shutdown_grace %s",
			cfg.Server.ShutdownDelay, cfg.Server.ShutdownGrace)
	}
}

// checkPod: replicas (or the HPA's), selector, probes on the admin port, resources, the
// security context, and the PodDisruptionBudgets and HPAs that refer to the pods.
func checkPod(r reporter, m *manifests, d *appsv1.Deployment) {
	r.Helper()
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	if !selects(d.Spec.Selector, d.Spec.Template.Labels) {
		r.Errorf("Deployment selector does not select its own pods")
	}
	// One pod down (a drain, a rollout) must leave one serving.
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	for _, h := range m.hpas {
		if h.Spec.MinReplicas != nil && (d.Spec.Replicas == nil || *h.Spec.MinReplicas > replicas) {
			replicas = *h.Spec.MinReplicas
		}
	}
	if replicas < 2 {
		r.Errorf("replicas: %d; want 2 at least (replicas, or the HPA's minReplicas)", replicas)
	}
	probe := func(name string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil {
			r.Errorf("%s: want an httpGet probe", name)
			return
		}
		if p.HTTPGet.Path != path || p.HTTPGet.Port != intstr.FromString("admin") {
			r.Errorf("%s: want %s on port admin, got %s on %s", name, path, p.HTTPGet.Path, p.HTTPGet.Port.String())
		}
	}
	probe("livenessProbe", c.LivenessProbe, "/healthz")
	probe("readinessProbe", c.ReadinessProbe, "/readyz")
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[res]; !ok {
			r.Errorf("resources.requests.%s missing", res)
		}
		if _, ok := c.Resources.Limits[res]; !ok {
			r.Errorf("resources.limits.%s missing", res)
		}
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		r.Errorf("container securityContext missing")
	default:
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			r.Errorf("allowPrivilegeEscalation must be false")
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			r.Errorf("readOnlyRootFilesystem must be true")
		}
		if sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			r.Errorf("capabilities must drop ALL")
		}
	}
	nonRoot := (sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) ||
		(spec.SecurityContext != nil && spec.SecurityContext.RunAsNonRoot != nil && *spec.SecurityContext.RunAsNonRoot)
	if !nonRoot {
		r.Errorf("runAsNonRoot must be true")
	}
	for _, p := range m.pdbs {
		if !selects(p.Spec.Selector, d.Spec.Template.Labels) {
			r.Errorf("PodDisruptionBudget %s does not select the gateway pods", p.Name)
		}
		if p.Spec.MinAvailable == nil && p.Spec.MaxUnavailable == nil {
			r.Errorf("PodDisruptionBudget %s sets neither minAvailable nor maxUnavailable", p.Name)
		}
	}
	for _, h := range m.hpas {
		ref := h.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.Name != d.Name || ref.APIVersion != "apps/v1" {
			r.Errorf("HPA %s targets %s %s/%s, not the gateway Deployment", h.Name, ref.APIVersion, ref.Kind, ref.Name)
		}
		cpu := false
		for _, mt := range h.Spec.Metrics {
			if mt.Type == autoscalingv2.ResourceMetricSourceType && mt.Resource != nil && mt.Resource.Name == corev1.ResourceCPU {
				cpu = true
			}
		}
		if !cpu {
			r.Errorf("HPA %s has no CPU metric", h.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas > h.Spec.MaxReplicas {
			r.Errorf("HPA %s: minReplicas must be set and not above maxReplicas", h.Name)
		}
	}
}

// secretName matches the environment variables that carry secrets.
var secretName = regexp.MustCompile(`TOKEN|PASSWORD|SECRET|CREDENTIAL`)

// checkSecretHygiene: secrets reach the container from Secrets only, and no Secret's value
// is also in a ConfigMap.
func checkSecretHygiene(r reporter, m *manifests, c corev1.Container) {
	r.Helper()
	admin := false
	for _, e := range c.Env {
		ref := e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
		if secretName.MatchString(e.Name) && !ref {
			r.Errorf("env %s carries a secret: take it from a Secret (valueFrom.secretKeyRef), not a literal", e.Name)
		}
		admin = admin || e.Name == "GATEWAY_ADMIN_TOKEN" && ref
	}
	if !admin {
		r.Errorf("GATEWAY_ADMIN_TOKEN does not come from a Secret")
	}
	for _, s := range m.secrets {
		values := map[string]string{}
		for k, v := range s.Data {
			values[k] = string(v)
		}
		for k, v := range s.StringData {
			values[k] = v
		}
		for k, v := range values {
			if len(v) < 8 {
				r.Errorf("Secret %s key %s: %d characters is no secret", s.Name, k, len(v))
				continue
			}
			for _, cm := range m.configMaps {
				for file, data := range cm.Data {
					if strings.Contains(data, v) {
						r.Errorf("ConfigMap %s (%s) holds the value of Secret %s key %s", cm.Name, file, s.Name, k)
					}
				}
			}
		}
	}
}

// checkServices: every Service selects the pods and targets named container ports; the
// http and admin ports are served; the admin port is on no Service reachable from outside
// the cluster.
func checkServices(r reporter, m *manifests, d *appsv1.Deployment, ports map[string]int32) {
	r.Helper()
	served := map[string]int32{}
	for _, svc := range m.services {
		if !selectsMap(svc.Spec.Selector, d.Spec.Template.Labels) {
			r.Errorf("Service %s does not select the Deployment's pods", svc.Name)
		}
		admin := false
		for _, p := range svc.Spec.Ports {
			target := p.TargetPort.StrVal
			if p.TargetPort.Type == intstr.Int {
				target = ""
				for name, n := range ports {
					if n == p.TargetPort.IntVal {
						target = name
					}
				}
			}
			if _, ok := ports[target]; !ok {
				r.Errorf("Service %s port %s targets %s, which is no named port of the gateway container", svc.Name, p.Name, p.TargetPort.String())
				continue
			}
			served[p.Name] = p.Port
			admin = admin || target == "admin"
		}
		public := (svc.Spec.Type != "" && svc.Spec.Type != corev1.ServiceTypeClusterIP) || len(svc.Spec.ExternalIPs) > 0
		if admin && public {
			r.Errorf("Service %s (type %s, external IPs %v) exposes the admin port outside the cluster", svc.Name, svc.Spec.Type, svc.Spec.ExternalIPs)
		}
	}
	if served["http"] != httpPort || served["admin"] != adminPort {
		r.Errorf("Service ports: want http %d and admin %d, got %v", httpPort, adminPort, served)
	}
}

// checkServiceMonitors: each scrapes the admin port's /metrics of a Service it selects, with
// the admin token the pods use, as job="gateway" (deploy/prometheus/alerts.yaml expects it).
func checkServiceMonitors(r reporter, m *manifests, c corev1.Container) {
	r.Helper()
	var token *corev1.SecretKeySelector
	for _, e := range c.Env {
		if e.Name == "GATEWAY_ADMIN_TOKEN" && e.ValueFrom != nil {
			token = e.ValueFrom.SecretKeyRef
		}
	}
	for _, sm := range m.monitors {
		if len(sm.Spec.Endpoints) == 0 {
			r.Errorf("ServiceMonitor %s has no endpoints", sm.Metadata.Name)
		}
		for _, ep := range sm.Spec.Endpoints {
			if ep.Port != "admin" || ep.Path != "/metrics" {
				r.Errorf("ServiceMonitor %s: want port admin path /metrics, got %q %q", sm.Metadata.Name, ep.Port, ep.Path)
			}
			if a := ep.Authorization; a == nil || a.Type != "Bearer" || token == nil ||
				a.Credentials.Name != token.Name || a.Credentials.Key != token.Key {
				r.Errorf("ServiceMonitor %s: want the admin token of the pods (GATEWAY_ADMIN_TOKEN) as Bearer credentials", sm.Metadata.Name)
			}
			scraped := 0
			for _, svc := range m.services {
				if !selects(&sm.Spec.Selector, svc.Labels) || !namesPort(svc, ep.Port) {
					continue
				}
				scraped++
				// The operator takes the job from the Service's jobLabel label, else its name.
				job := svc.Name
				if v := svc.Labels[sm.Spec.JobLabel]; sm.Spec.JobLabel != "" && v != "" {
					job = v
				}
				if job != "gateway" {
					r.Errorf("ServiceMonitor %s scrapes Service %s as job %q; deploy/prometheus/alerts.yaml expects gateway", sm.Metadata.Name, svc.Name, job)
				}
			}
			if scraped == 0 {
				r.Errorf("ServiceMonitor %s selects no Service naming port %q", sm.Metadata.Name, ep.Port)
			}
		}
	}
}

func namesPort(svc *corev1.Service, name string) bool {
	for _, p := range svc.Spec.Ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

// checkNetworkPolicy: the NetworkPolicy lets the ingress controller reach the public port
// only, and Prometheus the admin port only: each rule names one peer and one of the
// Deployment's named ports.
func checkNetworkPolicy(r reporter, m *manifests) {
	r.Helper()
	if len(m.deployments) != 1 || len(m.policies) != 1 {
		r.Errorf("want one Deployment and one NetworkPolicy, got %d and %d", len(m.deployments), len(m.policies))
		return
	}
	np, d := m.policies[0], m.deployments[0]
	if !selects(&np.Spec.PodSelector, d.Spec.Template.Labels) {
		r.Errorf("the NetworkPolicy does not select the gateway pods")
		return
	}
	if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
		r.Errorf("policyTypes %v, want [Ingress]", np.Spec.PolicyTypes)
		return
	}
	containerPorts := map[string]int32{}
	for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
		containerPorts[p.Name] = p.ContainerPort
	}
	// Which port each peer may reach, by the peer's pod label.
	reach := map[string][]string{}
	for i, rule := range np.Spec.Ingress {
		if len(rule.From) != 1 || len(rule.Ports) != 1 {
			r.Errorf("ingress[%d]: want one peer and one port, got %d and %d", i, len(rule.From), len(rule.Ports))
			return
		}
		peer := rule.From[0]
		if peer.IPBlock != nil || peer.PodSelector == nil || peer.NamespaceSelector == nil ||
			len(peer.PodSelector.MatchLabels) == 0 || len(peer.NamespaceSelector.MatchLabels) == 0 {
			r.Errorf("ingress[%d]: the peer must name both a namespace and pods (an empty selector lets everybody in)", i)
			return
		}
		port := rule.Ports[0]
		if port.Port == nil || port.Port.Type != intstr.String || containerPorts[port.Port.StrVal] == 0 {
			r.Errorf("ingress[%d]: port %v is not a named port of the gateway container", i, port.Port)
			return
		}
		name := peer.PodSelector.MatchLabels["app.kubernetes.io/name"]
		reach[name] = append(reach[name], port.Port.StrVal)
	}
	if strings.Join(reach["ingress-nginx"], ",") != "http" || strings.Join(reach["prometheus"], ",") != "admin" || len(reach) != 2 {
		r.Errorf("who reaches what: %v; want the ingress controller on http only and Prometheus on admin only", reach)
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
