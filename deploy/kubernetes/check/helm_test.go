package check

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// The Helm chart is linted and rendered by Helm's own Go module (what helm lint and helm
// template run), and every rendering goes through the checks the kustomize base passes
// (checks_test.go), plus the chart's own: secrets only in Secrets, the admin port never on the
// public Service, the ServiceMonitor gated by values and by the cluster's API versions, and
// the defaults mirroring the base.

const (
	chartDir      = "../../helm/gateway"
	clusterValues = chartDir + "/ci/redis-cluster-values.yaml"
	release       = "gateway"
	namespace     = "gateway"
	monitoringAPI = "monitoring.coreos.com/v1"
)

// monitored turns the ServiceMonitor on (render it with monitoringAPI).
var monitored = map[string]any{"serviceMonitor": map[string]any{"enabled": true}}

// kubeVersion is the cluster the chart is linted and rendered for.
var kubeVersion = chartutil.KubeVersion{Version: "v1.33.0", Major: "1", Minor: "33"}

// valuesFile reads a values file as helm -f does.
func valuesFile(t *testing.T, name string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return v.AsMap()
}

// render is helm template: the chart with the user's values, installed as release "gateway"
// on a cluster that serves the built-in API versions and apis.
func render(vals map[string]any, apis ...string) (map[string]string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = kubeVersion
	caps.APIVersions = append(slices.Clone(caps.APIVersions), apis...)
	top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, top)
}

// renderManifests renders and decodes every manifest strictly (NOTES.txt must render too).
func renderManifests(t *testing.T, vals map[string]any, apis ...string) *manifests {
	t.Helper()
	files, err := render(vals, apis...)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	m := &manifests{}
	notes := false
	for _, name := range slices.Sorted(maps.Keys(files)) {
		switch base := path.Base(name); {
		case base == "NOTES.txt":
			notes = strings.Contains(files[name], "kubectl")
		case strings.HasPrefix(base, "_"):
		default:
			m.addDocs(t, name, files[name])
		}
	}
	if !notes {
		t.Error("NOTES.txt did not render")
	}
	if t.Failed() {
		t.FailNow()
	}
	return m
}

// checkChart runs the kustomize base's checks and the chart's own on one rendering.
func checkChart(t *testing.T, m *manifests) {
	t.Helper()
	checkFitsTogether(t, m)
	checkNetworkPolicy(t, m)
	if len(m.deployments) != 1 {
		return
	}
	d := m.deployments[0]
	// The HPA owns the count: a replicas field would reset it at every helm upgrade.
	if len(m.hpas) > 0 && d.Spec.Replicas != nil {
		t.Errorf("Deployment sets replicas %d beside an HPA", *d.Spec.Replicas)
	}
	if d.Spec.Template.Annotations["checksum/config"] == "" {
		t.Error("no checksum/config annotation: a config change would not roll the pods")
	}
	for _, svc := range m.services {
		var names []string
		for _, p := range svc.Spec.Ports {
			names = append(names, p.Name)
		}
		switch strings.Join(names, ",") {
		case "http":
		case "admin":
			if svc.Spec.Type != corev1.ServiceTypeClusterIP {
				t.Errorf("admin Service %s has type %s, want ClusterIP", svc.Name, svc.Spec.Type)
			}
		default:
			t.Errorf("Service %s has ports %v: want the public port or the admin port alone", svc.Name, names)
		}
	}
}

func counts(m *manifests) string {
	return fmt.Sprintf("ConfigMap %d Secret %d Deployment %d Service %d PDB %d HPA %d NetworkPolicy %d ServiceMonitor %d",
		len(m.configMaps), len(m.secrets), len(m.deployments), len(m.services), len(m.pdbs), len(m.hpas), len(m.policies), len(m.monitors))
}

// TestChartLint is helm lint --strict with the default values and with each file in ci/.
func TestChartLint(t *testing.T) {
	for name, vals := range map[string]map[string]any{
		"default":       {},
		"redis-cluster": valuesFile(t, clusterValues),
	} {
		t.Run(name, func(t *testing.T) {
			l := lint.AllWithKubeVersion(chartDir, vals, namespace, &kubeVersion)
			for _, msg := range l.Messages {
				if msg.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", msg)
				} else {
					t.Logf("helm lint: %s", msg)
				}
			}
		})
	}
}

func TestChartDefault(t *testing.T) {
	m := renderManifests(t, nil)
	want := "ConfigMap 1 Secret 1 Deployment 1 Service 2 PDB 1 HPA 1 NetworkPolicy 1 ServiceMonitor 0"
	if got := counts(m); got != want {
		t.Fatalf("rendered %s; want %s", got, want)
	}
	checkChart(t, m)
	// No token given: the chart generated one for its Secret.
	if s := m.secrets[0]; len(s.Data["token"]) < 32 {
		t.Errorf("Secret %s: generated token of %d characters", s.Name, len(s.Data["token"]))
	}
}

func TestChartRedisCluster(t *testing.T) {
	m := renderManifests(t, valuesFile(t, clusterValues))
	want := "ConfigMap 1 Secret 1 Deployment 1 Service 2 PDB 1 HPA 1 NetworkPolicy 1 ServiceMonitor 0"
	if got := counts(m); got != want {
		t.Fatalf("rendered %s; want %s", got, want)
	}
	checkChart(t, m)
	c := m.deployments[0].Spec.Template.Spec.Containers[0]
	cfg := checkConfig(t, m, c)
	if cfg == nil {
		t.FailNow()
	}
	// Several addresses and no master_name: the gateway is a Cluster client.
	if len(cfg.Redis.Addrs) < 3 || cfg.Redis.MasterName != "" {
		t.Errorf("redis: addrs %v, master_name %q; want a Cluster's nodes", cfg.Redis.Addrs, cfg.Redis.MasterName)
	}
	ref := envRef(c, "REDIS_PASSWORD")
	if ref == nil || ref.Name != "redis-cluster" || ref.Key != "redis-password" || cfg.Redis.Password == "" {
		t.Errorf("REDIS_PASSWORD: %+v; want the Redis Cluster release's Secret redis-cluster, key redis-password", ref)
	}
}

func envRef(c corev1.Container, name string) *corev1.SecretKeySelector {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil {
			return e.ValueFrom.SecretKeyRef
		}
	}
	return nil
}

// TestChartSecrets: given values land in the chart's Secrets only; existing Secrets are
// referenced and not rendered.
func TestChartSecrets(t *testing.T) {
	const token, password = "admin-token-from-values-0123456789", "redis-password-from-values-42"
	t.Run("values", func(t *testing.T) {
		m := renderManifests(t, map[string]any{
			"adminToken": map[string]any{"value": token},
			"redis":      map[string]any{"password": password},
		})
		checkChart(t, m)
		if len(m.secrets) != 2 {
			t.Fatalf("want the admin and Redis Secrets, got %d", len(m.secrets))
		}
		c := m.deployments[0].Spec.Template.Spec.Containers[0]
		for name, want := range map[string]string{"GATEWAY_ADMIN_TOKEN": token, "REDIS_PASSWORD": password} {
			ref := envRef(c, name)
			if ref == nil {
				t.Errorf("%s does not come from a Secret", name)
				continue
			}
			if s := findSecret(m, ref.Name); s == nil || string(s.Data[ref.Key]) != want {
				t.Errorf("%s: Secret %s key %s does not hold the value given", name, ref.Name, ref.Key)
			}
		}
		cfg := checkConfig(t, m, c)
		if cfg == nil || cfg.AdminToken != token || cfg.Redis.Password != password {
			t.Error("the gateway would not start with the token and password given")
		}
	})
	t.Run("existing", func(t *testing.T) {
		m := renderManifests(t, map[string]any{
			"adminToken": map[string]any{"existingSecret": "ops-admin", "existingSecretKey": "admin-token"},
			"redis":      map[string]any{"existingSecret": "ops-redis"},
		}, monitoringAPI)
		if len(m.secrets) != 0 {
			t.Errorf("rendered %d Secrets beside existing ones", len(m.secrets))
		}
		checkChart(t, m)
		c := m.deployments[0].Spec.Template.Spec.Containers[0]
		if ref := envRef(c, "GATEWAY_ADMIN_TOKEN"); ref == nil || ref.Name != "ops-admin" || ref.Key != "admin-token" {
			t.Errorf("GATEWAY_ADMIN_TOKEN from %+v, want ops-admin/admin-token", ref)
		}
		if ref := envRef(c, "REDIS_PASSWORD"); ref == nil || ref.Name != "ops-redis" || ref.Key != "password" {
			t.Errorf("REDIS_PASSWORD from %+v, want ops-redis/password", ref)
		}
	})
}

// TestChartServiceMonitor: rendered only when enabled and the cluster serves the Prometheus
// Operator's API; then it passes the base's checks.
func TestChartServiceMonitor(t *testing.T) {
	on := map[string]any{"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}}}
	for _, tc := range []struct {
		name string
		vals map[string]any
		apis []string
		want int
	}{
		{"enabled, API served", on, []string{monitoringAPI}, 1},
		{"enabled, API missing", on, nil, 0},
		{"disabled, API served", nil, []string{monitoringAPI}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := renderManifests(t, tc.vals, tc.apis...)
			if len(m.monitors) != tc.want {
				t.Fatalf("%d ServiceMonitors, want %d", len(m.monitors), tc.want)
			}
			checkChart(t, m)
			if tc.want == 1 && m.monitors[0].Metadata.Labels["release"] != "prometheus" {
				t.Error("serviceMonitor.labels are not on the ServiceMonitor")
			}
		})
	}
}

// TestChartPublicService: a LoadBalancer for the API leaves the admin port on its ClusterIP
// Service.
func TestChartPublicService(t *testing.T) {
	for _, typ := range []string{"LoadBalancer", "NodePort"} {
		m := renderManifests(t, map[string]any{"service": map[string]any{"type": typ}})
		checkChart(t, m)
		for _, svc := range m.services {
			if namesPort(svc, "http") && string(svc.Spec.Type) != typ {
				t.Errorf("public Service %s has type %s, want %s", svc.Name, svc.Spec.Type, typ)
			}
		}
	}
}

// TestChartRefuses: values that would leak a secret, hide the admin listener from the probes
// or misspell a key fail helm template with a message naming the value.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct {
		vals string
		want string
	}{
		{"config: {admin_token: an-admin-token-in-the-configmap}", "config.admin_token"},
		{"config: {redis: {password: a-redis-password-in-the-configmap}}", "config.redis.password"},
		{"config: {admin_listen: '127.0.0.1:9090'}", "config.admin_listen"},
		{"adminToken: {value: short}", "at least 16 characters"},
		{"adminToken: {value: a-long-enough-admin-token, existingSecret: ops-admin}", "not both"},
		{"redis: {password: a-redis-password, existingSecret: ops-redis}", "not both"},
		{"service: {type: ExternalName}", "/service/type"},
		{"adminToken: {existingSecert: ops-admin}", "existingSecert"},
		// The gateway's own keys, from its config definition (deploy/helmschema): a misspelt
		// one fails the install instead of crash-looping the pods.
		{"config: {upstream: {timout: 3s}}", "timout"},
		{"config: {limits: {agent_job_per_project: {limt: 5}}}", "limt"},
		{"config: {redis: {tls: 'yes'}}", "/config/redis/tls"},
	} {
		var vals map[string]any
		if err := yaml.Unmarshal([]byte(tc.vals), &vals); err != nil {
			t.Fatal(err)
		}
		_, err := render(vals)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %s: helm template error %v, want one naming %s", tc.vals, err, tc.want)
		}
	}
	// As deploy/README.md's commands give values: --set, parsed as helm parses it.
	for set, ok := range map[string]bool{
		"config.upstream.timout=3s":                         false,
		"config.upstream.timeout=3s":                        true,
		"config.client_ip.trusted_proxies={10.96.200.0/29}": true,
		"config.limits.agent_job_per_project.limit=20":      true,
	} {
		vals := map[string]any{}
		if err := strvals.ParseInto(set, vals); err != nil {
			t.Fatal(err)
		}
		if _, err := render(vals); (err == nil) != ok {
			t.Errorf("--set %s: helm template error %v, want it to pass: %v", set, err, ok)
		}
	}
}

// TestChartMirrorsBase: with the default values the chart renders what the kustomize base
// holds: the same config, pod and container settings, drain timing, budget, autoscaling,
// NetworkPolicy peers, Service ports and scrape settings.
func TestChartMirrorsBase(t *testing.T) {
	base := load(t, baseDir)
	chart := renderManifests(t, monitored, monitoringAPI)
	if t.Failed() {
		t.FailNow()
	}
	same := func(what string, b, c any) {
		t.Helper()
		if !equality.Semantic.DeepEqual(b, c) {
			bj, _ := json.Marshal(b)
			cj, _ := json.Marshal(c)
			t.Errorf("%s differs:\nbase  %s\nchart %s", what, bj, cj)
		}
	}
	var bcfg, ccfg any
	if err := yaml.Unmarshal([]byte(base.configMaps[0].Data["config.yaml"]), &bcfg); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(chart.configMaps[0].Data["config.yaml"]), &ccfg); err != nil {
		t.Fatal(err)
	}
	same("config.yaml", bcfg, ccfg)

	bd, cd := base.deployments[0], chart.deployments[0]
	same("strategy", bd.Spec.Strategy, cd.Spec.Strategy)
	same("revisionHistoryLimit", bd.Spec.RevisionHistoryLimit, cd.Spec.RevisionHistoryLimit)
	same("replicas (chart: the HPA's minReplicas)", *bd.Spec.Replicas, *chart.hpas[0].Spec.MinReplicas)
	bp, cp := bd.Spec.Template.Spec, cd.Spec.Template.Spec
	same("terminationGracePeriodSeconds", bp.TerminationGracePeriodSeconds, cp.TerminationGracePeriodSeconds)
	same("automountServiceAccountToken", bp.AutomountServiceAccountToken, cp.AutomountServiceAccountToken)
	same("pod securityContext", bp.SecurityContext, cp.SecurityContext)
	same("topologySpreadConstraints", withoutSelectors(bp), withoutSelectors(cp))
	bc, cc := bp.Containers[0], cp.Containers[0]
	same("image repository", strings.Split(bc.Image, ":")[0], strings.Split(cc.Image, ":")[0])
	same("imagePullPolicy", bc.ImagePullPolicy, cc.ImagePullPolicy)
	same("command", bc.Command, cc.Command)
	same("args", bc.Args, cc.Args)
	same("ports", bc.Ports, cc.Ports)
	same("livenessProbe", bc.LivenessProbe, cc.LivenessProbe)
	same("readinessProbe", bc.ReadinessProbe, cc.ReadinessProbe)
	same("resources", bc.Resources, cc.Resources)
	same("container securityContext", bc.SecurityContext, cc.SecurityContext)
	same("volumeMounts", bc.VolumeMounts, cc.VolumeMounts)
	same("env", envShape(bc), envShape(cc))

	same("PodDisruptionBudget", []any{base.pdbs[0].Spec.MaxUnavailable, base.pdbs[0].Spec.MinAvailable},
		[]any{chart.pdbs[0].Spec.MaxUnavailable, chart.pdbs[0].Spec.MinAvailable})
	bh, ch := base.hpas[0].Spec, chart.hpas[0].Spec
	same("HPA", []any{bh.MinReplicas, bh.MaxReplicas, bh.Metrics, bh.Behavior}, []any{ch.MinReplicas, ch.MaxReplicas, ch.Metrics, ch.Behavior})
	same("NetworkPolicy", []any{base.policies[0].Spec.PolicyTypes, base.policies[0].Spec.Ingress},
		[]any{chart.policies[0].Spec.PolicyTypes, chart.policies[0].Spec.Ingress})
	same("Service ports", servicePorts(base), servicePorts(chart))
	if len(chart.monitors) != 1 {
		t.Fatal("no ServiceMonitor rendered")
	}
	be, ce := base.monitors[0].Spec.Endpoints[0], chart.monitors[0].Spec.Endpoints[0]
	same("ServiceMonitor endpoint", []any{be.Port, be.Path, be.Interval, be.ScrapeTimeout, be.Authorization.Type},
		[]any{ce.Port, ce.Path, ce.Interval, ce.ScrapeTimeout, ce.Authorization.Type})
}

func withoutSelectors(spec corev1.PodSpec) []corev1.TopologySpreadConstraint {
	out := slices.Clone(spec.TopologySpreadConstraints)
	for i := range out {
		out[i].LabelSelector = nil
	}
	return out
}

// envShape is the container's environment with Secret names left out (the chart names its
// own), and the base's optional Redis password (the chart adds it when a password is given).
func envShape(c corev1.Container) []corev1.EnvVar {
	var out []corev1.EnvVar
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			if ref := e.ValueFrom.SecretKeyRef; ref.Optional != nil && *ref.Optional {
				continue
			}
			e = corev1.EnvVar{Name: e.Name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: e.ValueFrom.SecretKeyRef.Key}}}
		}
		out = append(out, e)
	}
	return out
}

func servicePorts(m *manifests) []corev1.ServicePort {
	var out []corev1.ServicePort
	for _, svc := range m.services {
		out = append(out, svc.Spec.Ports...)
	}
	slices.SortFunc(out, func(a, b corev1.ServicePort) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// recorder collects what the checks report.
type recorder struct{ errs []string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestChecksCatch: the checks report each of these breakages of the rendered chart.
func TestChecksCatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		want   string
		mutate func(m *manifests, d *appsv1.Deployment, c *corev1.Container)
	}{
		{"admin port on a LoadBalancer", "exposes the admin port", func(m *manifests, _ *appsv1.Deployment, _ *corev1.Container) {
			for _, svc := range m.services {
				svc.Spec.Type = corev1.ServiceTypeLoadBalancer
			}
		}},
		{"admin token in the ConfigMap", "holds admin_token", func(m *manifests, _ *appsv1.Deployment, _ *corev1.Container) {
			m.configMaps[0].Data["config.yaml"] += "admin_token: an-admin-token-in-the-configmap\n"
		}},
		{"a Secret's value in the ConfigMap", "holds the value of Secret", func(m *manifests, _ *appsv1.Deployment, _ *corev1.Container) {
			m.configMaps[0].Data["notes"] = string(m.secrets[0].Data["token"])
		}},
		{"literal admin token", "GATEWAY_ADMIN_TOKEN carries a secret", func(_ *manifests, _ *appsv1.Deployment, c *corev1.Container) {
			c.Env[0] = corev1.EnvVar{Name: "GATEWAY_ADMIN_TOKEN", Value: "a-literal-admin-token-0123"}
		}},
		{"grace period below the drain", "terminationGracePeriodSeconds", func(_ *manifests, d *appsv1.Deployment, _ *corev1.Container) {
			d.Spec.Template.Spec.TerminationGracePeriodSeconds = new(int64(30))
		}},
		{"loopback admin listener", "loopback", func(m *manifests, _ *appsv1.Deployment, _ *corev1.Container) {
			m.configMaps[0].Data["config.yaml"] = strings.Replace(m.configMaps[0].Data["config.yaml"], "0.0.0.0:9090", "127.0.0.1:9090", 1)
		}},
		{"config that does not load", "does not load", func(m *manifests, _ *appsv1.Deployment, _ *corev1.Container) {
			m.configMaps[0].Data["config.yaml"] += "upstream_url: http://typo\n"
		}},
		{"probe on the public port", "readinessProbe", func(_ *manifests, _ *appsv1.Deployment, c *corev1.Container) {
			c.ReadinessProbe.HTTPGet.Port = intstr.FromString("http")
		}},
		{"writable root filesystem", "readOnlyRootFilesystem", func(_ *manifests, _ *appsv1.Deployment, c *corev1.Container) {
			c.SecurityContext.ReadOnlyRootFilesystem = new(false)
		}},
		{"one replica", "replicas", func(m *manifests, _ *appsv1.Deployment, _ *corev1.Container) {
			m.hpas[0].Spec.MinReplicas = new(int32(1))
		}},
		{"open NetworkPolicy peer", "must name both a namespace and pods", func(m *manifests, _ *appsv1.Deployment, _ *corev1.Container) {
			m.policies[0].Spec.Ingress[1].From[0].NamespaceSelector = nil
		}},
		{"trusted proxies as wide as the pod network", "wider than a /24", func(m *manifests, _ *appsv1.Deployment, _ *corev1.Container) {
			m.configMaps[0].Data["config.yaml"] = strings.Replace(m.configMaps[0].Data["config.yaml"], "10.96.200.0/29", "10.0.0.0/8", 1)
		}},
		{"ServiceMonitor job", "expects gateway", func(m *manifests, _ *appsv1.Deployment, _ *corev1.Container) {
			m.monitors[0].Spec.JobLabel = ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := renderManifests(t, monitored, monitoringAPI)
			d := m.deployments[0]
			tc.mutate(m, d, &d.Spec.Template.Spec.Containers[0])
			r := &recorder{}
			checkFitsTogether(r, m)
			checkNetworkPolicy(r, m)
			if !strings.Contains(strings.Join(r.errs, "\n"), tc.want) {
				t.Errorf("the checks did not report %q; they said %q", tc.want, r.errs)
			}
		})
	}
}
