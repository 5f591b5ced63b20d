// Package deploy holds only tests: they check the files under deploy/ (Docker, compose,
// Kubernetes, Grafana, Prometheus) against the real gateway binary, a real Prometheus and
// promtool. The Kubernetes manifests (the kustomize base, and the Helm chart rendered by Helm's
// Go module) are decoded into the Kubernetes API types by the separate module in
// deploy/kubernetes/check, so this module needs no Kubernetes or Helm dependencies.
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/docsgate/gateway/metrics"
)

// decodeStrict decodes every document of a YAML file into a fresh value from newV, failing on
// unknown fields when the value is a struct.
func decodeStrict(t *testing.T, path string, newV func() any) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	n := 0
	for {
		v := newV()
		err := dec.Decode(v)
		if errors.Is(err, io.EOF) {
			return n
		}
		if err != nil {
			t.Errorf("%s: document %d: %v", path, n+1, err)
			return n
		}
		n++
	}
}

// TestYAMLParses: every .yaml/.yml under deploy/ but the Helm chart's templates parses (every
// document of a multi-document file), and the files with a known schema decode strictly into
// it.
func TestYAMLParses(t *testing.T) {
	known := map[string]func() any{
		"compose/compose.yaml":   func() any { return new(composeFile) },
		"compose/prometheus.yml": func() any { return new(prometheusConfig) },
		"compose/grafana/provisioning/datasources/prometheus.yaml": func() any { return new(grafanaDatasources) },
		"compose/grafana/provisioning/dashboards/gateway.yaml":     func() any { return new(grafanaDashboardProviders) },
		"prometheus/alerts.yaml":                                   func() any { return new(ruleFile) },
		"prometheus/alerts_test.yaml":                              func() any { return new(ruleTestFile) },
	}
	seen := map[string]bool{}
	count := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// A Helm chart's templates are Go templates, not YAML: deploy/kubernetes/check
		// renders them with Helm and decodes the result.
		if d.IsDir() && filepath.ToSlash(path) == "helm/gateway/templates" {
			return filepath.SkipDir
		}
		if d.IsDir() || (!strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml")) {
			return nil
		}
		count++
		path = filepath.ToSlash(path)
		newV, ok := known[path]
		if !ok {
			newV = func() any { return new(any) }
		} else {
			seen[path] = true
		}
		if n := decodeStrict(t, path, newV); n == 0 && !t.Failed() {
			t.Errorf("%s: no YAML document", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for path := range known {
		if !seen[path] {
			t.Errorf("%s: missing", path)
		}
	}
	if count < 10 {
		t.Errorf("only %d YAML files found under deploy/", count)
	}
}

type composeFile struct {
	Name          string                    `yaml:"name"`
	XGatewayImage any                       `yaml:"x-gateway-image"`
	XGateway      any                       `yaml:"x-gateway"`
	Services      map[string]composeService `yaml:"services"`
	Secrets       map[string]struct {
		Environment string `yaml:"environment"`
		File        string `yaml:"file"`
	} `yaml:"secrets"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string            `yaml:"context"`
		Dockerfile string            `yaml:"dockerfile"`
		Args       map[string]string `yaml:"args"`
	} `yaml:"build"`
	Restart         string            `yaml:"restart"`
	DependsOn       any               `yaml:"depends_on"`
	Environment     map[string]string `yaml:"environment"`
	Volumes         []string          `yaml:"volumes"`
	Ports           []string          `yaml:"ports"`
	ReadOnly        bool              `yaml:"read_only"`
	CapDrop         []string          `yaml:"cap_drop"`
	SecurityOpt     []string          `yaml:"security_opt"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
	Entrypoint      []string          `yaml:"entrypoint"`
	Command         []string          `yaml:"command"`
	Secrets         []string          `yaml:"secrets"`
	Healthcheck     *struct {
		Test     []string `yaml:"test"`
		Interval string   `yaml:"interval"`
		Timeout  string   `yaml:"timeout"`
		Retries  int      `yaml:"retries"`
	} `yaml:"healthcheck"`
}

type prometheusConfig struct {
	Global struct {
		ScrapeInterval     string `yaml:"scrape_interval"`
		EvaluationInterval string `yaml:"evaluation_interval"`
	} `yaml:"global"`
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName        string `yaml:"job_name"`
		MetricsPath    string `yaml:"metrics_path"`
		ScrapeInterval string `yaml:"scrape_interval"`
		Authorization  *struct {
			Credentials     string `yaml:"credentials"`
			CredentialsFile string `yaml:"credentials_file"`
		} `yaml:"authorization"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

type grafanaDatasources struct {
	APIVersion  int `yaml:"apiVersion"`
	Datasources []struct {
		Name      string         `yaml:"name"`
		UID       string         `yaml:"uid"`
		Type      string         `yaml:"type"`
		Access    string         `yaml:"access"`
		URL       string         `yaml:"url"`
		IsDefault bool           `yaml:"isDefault"`
		Editable  bool           `yaml:"editable"`
		JSONData  map[string]any `yaml:"jsonData"`
	} `yaml:"datasources"`
}

type grafanaDashboardProviders struct {
	APIVersion int `yaml:"apiVersion"`
	Providers  []struct {
		Name                  string `yaml:"name"`
		Folder                string `yaml:"folder"`
		Type                  string `yaml:"type"`
		DisableDeletion       bool   `yaml:"disableDeletion"`
		AllowUIUpdates        bool   `yaml:"allowUiUpdates"`
		UpdateIntervalSeconds int    `yaml:"updateIntervalSeconds"`
		Options               struct {
			Path                      string `yaml:"path"`
			FoldersFromFilesStructure bool   `yaml:"foldersFromFilesStructure"`
		} `yaml:"options"`
	} `yaml:"providers"`
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type ruleTestFile struct {
	RuleFiles          []string `yaml:"rule_files"`
	EvaluationInterval string   `yaml:"evaluation_interval"`
	Tests              []struct {
		Interval    string `yaml:"interval"`
		InputSeries []struct {
			Series string `yaml:"series"`
			Values string `yaml:"values"`
		} `yaml:"input_series"`
		AlertRuleTest []struct {
			EvalTime  string `yaml:"eval_time"`
			Alertname string `yaml:"alertname"`
			ExpAlerts []struct {
				ExpLabels      map[string]string `yaml:"exp_labels"`
				ExpAnnotations map[string]string `yaml:"exp_annotations"`
			} `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// TestAlertRules: every alert has for:, a severity and summary/description annotations, and
// alerts_test.yaml has a firing and a silent case for each.
func TestAlertRules(t *testing.T) {
	var rf ruleFile
	decodeStrict(t, "prometheus/alerts.yaml", func() any { return &rf })
	var tf ruleTestFile
	decodeStrict(t, "prometheus/alerts_test.yaml", func() any { return &tf })
	firing, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tf.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) == 0 {
				silent[a.Alertname] = true
			} else {
				firing[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" {
				t.Errorf("group %s: a rule without alert: (recording rules belong elsewhere)", g.Name)
				continue
			}
			if r.For == "" {
				t.Errorf("%s: no for:", r.Alert)
			}
			switch r.Labels["severity"] {
			case "critical", "warning", "info":
			default:
				t.Errorf("%s: severity label %q", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs summary and description annotations", r.Alert)
			}
			if !firing[r.Alert] || !silent[r.Alert] {
				t.Errorf("%s: alerts_test.yaml needs a firing and a silent case (firing %t, silent %t)", r.Alert, firing[r.Alert], silent[r.Alert])
			}
		}
	}
	if n == 0 {
		t.Fatal("no rules")
	}
}

// dashboard is the subset of Grafana's dashboard model gateway.json uses; decoding rejects
// any other field, so a typo in a key fails here rather than silently in Grafana.
type dashboard struct {
	Title         string                    `json:"title"`
	UID           string                    `json:"uid"`
	Description   string                    `json:"description"`
	Tags          []string                  `json:"tags"`
	Timezone      string                    `json:"timezone"`
	SchemaVersion int                       `json:"schemaVersion"`
	Version       int                       `json:"version"`
	Editable      bool                      `json:"editable"`
	GraphTooltip  int                       `json:"graphTooltip"`
	Refresh       string                    `json:"refresh"`
	Time          struct{ From, To string } `json:"time"`
	Annotations   struct {
		List []json.RawMessage `json:"list"`
	} `json:"annotations"`
	Templating struct {
		List []templateVar `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type templateVar struct {
	Name       string          `json:"name"`
	Label      string          `json:"label"`
	Type       string          `json:"type"`
	Datasource *datasourceRef  `json:"datasource,omitempty"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition,omitempty"`
	Refresh    int             `json:"refresh"`
	IncludeAll bool            `json:"includeAll,omitempty"`
	Multi      bool            `json:"multi,omitempty"`
	AllValue   string          `json:"allValue,omitempty"`
	Current    json.RawMessage `json:"current"`
	Options    []any           `json:"options"`
	Hide       int             `json:"hide"`
	Regex      string          `json:"regex"`
	Sort       int             `json:"sort,omitempty"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int            `json:"id"`
	Type        string         `json:"type"`
	Title       string         `json:"title"`
	Description string         `json:"description,omitempty"`
	Collapsed   bool           `json:"collapsed,omitempty"`
	Datasource  *datasourceRef `json:"datasource,omitempty"`
	GridPos     struct {
		H, W, X, Y int
	} `json:"gridPos"`
	FieldConfig json.RawMessage `json:"fieldConfig,omitempty"`
	Options     json.RawMessage `json:"options,omitempty"`
	Targets     []struct {
		Datasource   *datasourceRef `json:"datasource,omitempty"`
		RefID        string         `json:"refId"`
		Expr         string         `json:"expr"`
		LegendFormat string         `json:"legendFormat,omitempty"`
	} `json:"targets,omitempty"`
	Panels []panel `json:"panels,omitempty"`
}

func loadDashboard(t *testing.T) *dashboard {
	t.Helper()
	data, err := os.ReadFile("grafana/gateway.json")
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(data) {
		t.Fatal("grafana/gateway.json is not valid JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("grafana/gateway.json: %v", err)
	}
	return &d
}

// panelQuery is one PromQL expression of the dashboard, with the panel it belongs to.
type panelQuery struct{ panel, expr string }

func dashboardQueries(d *dashboard) []panelQuery {
	var out []panelQuery
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out = append(out, panelQuery{p.Title, tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// TestDashboard: importable structure (datasource variable, unique ids, grid), every panel
// has a query, and the panels the runbook relies on are there.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.Title == "" || d.UID == "" || d.SchemaVersion == 0 {
		t.Error("title, uid and schemaVersion are required")
	}
	vars := map[string]templateVar{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["DS_PROMETHEUS"]; !ok || v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		t.Errorf("want a datasource variable DS_PROMETHEUS of type prometheus, got %+v", v)
	}
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q: gridPos %+v", p.Title, p.GridPos)
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			if p.Datasource == nil || p.Datasource.UID != "${DS_PROMETHEUS}" {
				t.Errorf("panel %q: datasource must be ${DS_PROMETHEUS}", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
					t.Errorf("panel %q: a target without expr or refId", p.Title)
				}
			}
		}
	}
	walk(d.Panels)
	all := ""
	for _, q := range dashboardQueries(d) {
		all += q.expr + "\n"
	}
	for _, want := range []string{
		"gateway_requests_total", "gateway_request_duration_seconds_bucket",
		`gateway_ratelimit_decisions_total{route=~"$route",decision="denied"}`,
		"gateway_ratelimit_near_limit_total", "topk(10, sum by (org, decision) (rate(gateway_org_requests_total",
		"gateway_ratelimit_decision_duration_seconds_bucket", "sum by (kind) (rate(gateway_ratelimit_decision_errors_total", "gateway_ratelimit_breaker_open",
		"gateway_stream_first_byte_seconds_bucket", "gateway_stream_duration_seconds_bucket",
		"sum by (route, kind) (rate(gateway_upstream_errors_total",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no panel queries %s", want)
		}
	}
}

var (
	metricToken   = regexp.MustCompile(`\b((?:gateway|go|process)_[a-zA-Z0-9_:]+|up)\b`)
	selectorToken = regexp.MustCompile(`\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{`)
	quoted        = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlWords   = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
)

// metricNames returns the metric names a PromQL expression reads: names with the gateway's,
// Go's or the process collector's prefix, up, and any other identifier in front of a selector.
func metricNames(expr string) []string {
	expr = quoted.ReplaceAllString(expr, `""`) // label values are not names
	seen := map[string]bool{}
	var out []string
	add := func(n string) {
		if !seen[n] && !promqlWords[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	for _, m := range metricToken.FindAllStringSubmatch(expr, -1) {
		add(m[1])
	}
	for _, m := range selectorToken.FindAllStringSubmatch(expr, -1) {
		add(m[1])
	}
	return out
}

// usedMetrics maps each metric name the dashboard and the alert rules read to where.
func usedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	for _, q := range dashboardQueries(loadDashboard(t)) {
		for _, n := range metricNames(q.expr) {
			used[n] = append(used[n], "dashboard panel "+q.panel)
		}
	}
	for _, v := range loadDashboard(t).Templating.List {
		if v.Type == "query" {
			var q struct{ Query string }
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Errorf("variable %s: %v", v.Name, err)
			}
			for _, n := range metricNames(strings.Replace(q.Query, "label_values(", "(", 1)) {
				used[n] = append(used[n], "dashboard variable "+v.Name)
			}
		}
	}
	var rf ruleFile
	decodeStrict(t, "prometheus/alerts.yaml", func() any { return &rf })
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			for _, n := range metricNames(r.Expr) {
				used[n] = append(used[n], "alert "+r.Alert)
			}
		}
	}
	return used
}

func TestMetricNameExtraction(t *testing.T) {
	got := metricNames(`histogram_quantile(0.9, sum by (le, route) (rate(gateway_x_bucket{route=~"gateway_fake"}[5m]))) / on(job) foo_bar{a="b"} and up == 0`)
	want := []string{"gateway_x_bucket", "up", "foo_bar"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("metricNames = %v, want %v", got, want)
	}
}

// selector is one metric selector of the alerts or the dashboard, e.g.
// gateway_requests_total{code="429"}, with where it is used.
type selector struct {
	name, expr string
	users      []string
}

var selectorOf = regexp.MustCompile(`\b((?:gateway|go|process)_[a-zA-Z0-9_:]+)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?`)

// selectors returns the selectors of the gateway's, Go's and the process collector's metrics
// in a PromQL expression.
func selectors(expr string) []selector {
	var out []selector
	for _, m := range selectorOf.FindAllStringSubmatch(expr, -1) {
		out = append(out, selector{name: m[1], expr: m[0]})
	}
	return out
}

// usedSelectors lists every distinct selector the dashboard's panels and the alert rules read.
func usedSelectors(t *testing.T) []selector {
	t.Helper()
	byExpr := map[string]*selector{}
	var order []string
	add := func(expr, user string) {
		for _, s := range selectors(expr) {
			if byExpr[s.expr] == nil {
				byExpr[s.expr] = &selector{name: s.name, expr: s.expr}
				order = append(order, s.expr)
			}
			byExpr[s.expr].users = append(byExpr[s.expr].users, user)
		}
	}
	for _, q := range dashboardQueries(loadDashboard(t)) {
		add(q.expr, "dashboard panel "+q.panel)
	}
	var rf ruleFile
	decodeStrict(t, "prometheus/alerts.yaml", func() any { return &rf })
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			add(r.Expr, "alert "+r.Alert)
		}
	}
	out := make([]selector, 0, len(order))
	for _, e := range order {
		out = append(out, *byExpr[e])
	}
	return out
}

// notAtStart are the metrics whose series cannot exist before their first event.
var notAtStart = map[string]string{
	"gateway_validation_rejections_total": "its field label is the refused field's path in the request body (the validators' open vocabulary): a series appears with the first refusal of that field",
}

func TestSelectorExtraction(t *testing.T) {
	got := selectors(`sum by (job) (rate(gateway_x_total{kind=~"a|b}", route="r"}[5m])) / on(job) gateway_y > 0 and up == 0`)
	want := []string{`gateway_x_total{kind=~"a|b}", route="r"}`, `gateway_y`}
	if len(got) != len(want) {
		t.Fatalf("selectors = %v, want %v", got, want)
	}
	for i := range want {
		if got[i].expr != want[i] {
			t.Fatalf("selectors = %v, want %v", got, want)
		}
	}
}

// TestNoDeprecatedNames: the dashboard, the alerts and their tests read the current names of
// renamed metrics, never the deprecated ones the gateway still exports for one release.
func TestNoDeprecatedNames(t *testing.T) {
	for _, path := range []string{"grafana/gateway.json", "prometheus/alerts.yaml", "prometheus/alerts_test.yaml"} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range metrics.Renames() {
			if regexp.MustCompile(`\b` + r.Old + `\b`).Match(data) {
				t.Errorf("%s reads %s, deprecated: use %s", path, r.Old, r.New)
			}
		}
	}
}
