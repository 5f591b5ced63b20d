package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// value reads one series from reg; labels are name, value pairs. -1 means absent.
func value(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if len(got) != len(labels)/2 {
				continue
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue next
				}
			}
			switch {
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

func TestSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	r := m.Route("agent_job")
	r.Request(201)
	r.Request(201)
	r.Request(700) // not pre-resolved: looked up when it happens
	r.AuthRejected("missing")
	l := r.Limit("agent_job_per_project", false)
	if l.TokensNear != nil {
		t.Error("a requests limit has a tokens series")
	}
	l.Allowed.Inc()
	r.Limit("tokens_per_org", true).TokensNear.Inc()
	r.Tokens("acme", 12, 30)
	r.Tokens("acme", 3, 0)
	r.TokensEstimated(7, 0)
	r.TokensEstimated(1, 2)
	l.ShadowDenied.Inc()
	m.Org("acme").Denied.Inc()
	r.Deprecated("other")
	r.StreamFinished("stop")
	m.BreakerOpen("10.0.0.1:6379", true)
	m.BreakerOpen("10.0.0.2:6379", false)
	m.BreakerOpen("10.0.0.3:6379", true)
	m.BreakerGone("10.0.0.3:6379")
	m.LimiterErrorKinds("data", "node")
	m.LimiterCall(0.001, "node")
	m.LimiterCall(0.001, "")
	m.Refunded("agent_job_per_project", "upstream_401")
	m.StreamRoutes("assistant_message", "assistant_message_v2")
	m.Route("assistant_message").StreamStalled()

	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"gateway_requests_total", []string{"route", "agent_job", "code", "201"}, 2},
		{"gateway_requests_total", []string{"route", "agent_job", "code", "700"}, 1},
		{"gateway_requests_total", []string{"route", "agent_job", "code", "404"}, 0}, // pre-resolved
		{"gateway_auth_rejections_total", []string{"route", "agent_job", "reason", "missing"}, 1},
		{"gateway_ratelimit_decisions_total", []string{"route", "agent_job", "limit", "agent_job_per_project", "decision", "allowed"}, 1},
		{"gateway_ratelimit_decisions_total", []string{"route", "agent_job", "limit", "agent_job_per_project", "decision", "shadow_denied"}, 1},
		{"gateway_org_requests_total", []string{"org", "acme", "decision", "denied"}, 1},
		{"gateway_deprecated_requests_total", []string{"route", "agent_job", "org", "other"}, 1},
		{"gateway_stream_finished_total", []string{"route", "agent_job", "reason", "stop"}, 1},
		{"gateway_ratelimit_breaker_open", []string{"node", "10.0.0.1:6379"}, 1},
		{"gateway_ratelimit_breaker_open", []string{"node", "10.0.0.2:6379"}, 0},
		{"gateway_ratelimit_breaker_open", []string{"node", "10.0.0.3:6379"}, -1}, // left the layout
		{"gateway_ratelimit_tokens_near_limit_total", []string{"route", "agent_job", "limit", "tokens_per_org"}, 1},
		{"gateway_ratelimit_tokens_near_limit_total", []string{"route", "agent_job", "limit", "agent_job_per_project"}, -1},
		{"gateway_stream_tokens_total", []string{"route", "agent_job", "org", "acme", "kind", "prompt"}, 15},
		{"gateway_stream_tokens_total", []string{"route", "agent_job", "org", "acme", "kind", "completion"}, 30},
		{"gateway_stream_tokens_estimated_total", []string{"route", "agent_job", "kind", "prompt"}, 8},
		{"gateway_stream_tokens_estimated_total", []string{"route", "agent_job", "kind", "completion"}, 2},
		{"gateway_ratelimit_decision_errors_total", []string{"kind", "node"}, 1},
		{"gateway_ratelimit_decision_errors_total", []string{"kind", "data"}, 0}, // created at 0
		{"gateway_ratelimit_refunds_total", []string{"limit", "agent_job_per_project", "reason", "upstream_401"}, 1},
		{"gateway_stream_stalled_total", []string{"route", "assistant_message"}, 1},
		{"gateway_stream_stalled_total", []string{"route", "assistant_message_v2"}, 0}, // created at 0
		{"gateway_stream_stalled_total", []string{"route", "agent_job"}, -1},           // no stream route
	} {
		if got := value(t, reg, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// The Go and process collectors are registered too.
	if value(t, reg, "go_goroutines") <= 0 {
		t.Error("go_goroutines missing")
	}
}

// Each renamed metric is still exported under its old name, with the same labels and values,
// and a help text that says what replaces it.
func TestDeprecatedNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	r := m.Route("assistant_message")
	m.LimiterCall(0.002, "timeout")
	m.LimiterCall(0.001, "")
	m.BreakerOpen("10.0.0.1:6379", true)
	r.Limit("tokens_per_org", true).TokensNear.Add(3)
	m.HoldExpired("tokens_per_org")
	m.StreamRoutes("assistant_message")
	r.StreamStalled()
	renames := Renames()
	want := [][]string{nil, {"kind", "timeout"}, {"node", "10.0.0.1:6379"}, {"route", "assistant_message", "limit", "tokens_per_org"}, {"limit", "tokens_per_org"}, {"route", "assistant_message"}}
	wantValue := []float64{2, 1, 1, 3, 1, 1}
	if len(renames) != len(want) {
		t.Fatalf("%d renames, the test knows %d", len(renames), len(want))
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	help := map[string]string{}
	for _, mf := range mfs {
		help[mf.GetName()] = mf.GetHelp()
	}
	for i, rn := range renames {
		oldV, newV := value(t, reg, rn.Old, want[i]...), value(t, reg, rn.New, want[i]...)
		if oldV != wantValue[i] || newV != wantValue[i] {
			t.Errorf("%s = %v and %s = %v, want %v for both", rn.Old, oldV, rn.New, newV, wantValue[i])
		}
		if h := help[rn.Old]; h != "Deprecated: use "+rn.New+"; removed in the next release." {
			t.Errorf("%s help %q", rn.Old, h)
		}
		if strings.HasPrefix(help[rn.New], "Deprecated") {
			t.Errorf("%s is the new name, but its help says deprecated", rn.New)
		}
	}
}

func TestBuildAndConfigSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.Build("v1.2.3", "abc123", "go1.26.8")
	m.Build("v1.2.4", "def456", "go1.26.8") // replaces, never adds a second series
	if got := value(t, reg, "gateway_build_info", "version", "v1.2.4", "revision", "def456", "goversion", "go1.26.8"); got != 1 {
		t.Errorf("gateway_build_info = %v, want 1", got)
	}
	if got := value(t, reg, "gateway_build_info", "version", "v1.2.3", "revision", "abc123", "goversion", "go1.26.8"); got != -1 {
		t.Errorf("the replaced gateway_build_info is still there: %v", got)
	}
	start := time.Unix(1_800_000_000, 500_000_000)
	m.ConfigLoaded(true, start)
	if ok, at := value(t, reg, "gateway_config_last_reload_successful"), value(t, reg, "gateway_config_last_reload_success_timestamp_seconds"); ok != 1 || at != 1_800_000_000.5 {
		t.Errorf("after a load: successful %v at %v", ok, at)
	}
	m.ConfigLoaded(false, start.Add(time.Hour))
	if ok, at := value(t, reg, "gateway_config_last_reload_successful"), value(t, reg, "gateway_config_last_reload_success_timestamp_seconds"); ok != 0 || at != 1_800_000_000.5 {
		t.Errorf("after a rejected reload: successful %v at %v (the config in force keeps its time)", ok, at)
	}
}

func TestKnownSeriesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	r := m.Route("assistant_message")
	r.AuthReasons("missing")
	r.UpstreamKinds("timeout")
	r.FinishReasons("stop")
	r.StreamOrgs("acme", "other")
	r.DeprecatedOrgs("other")
	m.RefundReasons("assistant_per_org", "upstream_401")
	for _, c := range []struct {
		name   string
		labels []string
	}{
		{"gateway_auth_rejections_total", []string{"route", "assistant_message", "reason", "missing"}},
		{"gateway_upstream_errors_total", []string{"route", "assistant_message", "kind", "timeout"}},
		{"gateway_stream_finished_total", []string{"route", "assistant_message", "reason", "stop"}},
		{"gateway_stream_tokens_total", []string{"route", "assistant_message", "org", "acme", "kind", "prompt"}},
		{"gateway_stream_tokens_total", []string{"route", "assistant_message", "org", "other", "kind", "completion"}},
		{"gateway_stream_tokens_estimated_total", []string{"route", "assistant_message", "kind", "completion"}},
		{"gateway_deprecated_requests_total", []string{"route", "assistant_message", "org", "other"}},
		{"gateway_ratelimit_refunds_total", []string{"limit", "assistant_per_org", "reason", "upstream_401"}},
	} {
		if got := value(t, reg, c.name, c.labels...); got != 0 {
			t.Errorf("%s%v = %v, want 0", c.name, c.labels, got)
		}
	}
}

// A bucket takes a trace-id exemplar at most once per exemplarEvery; every observation is
// still counted, and another bucket takes its own.
func TestExemplarsAtMostOncePerBucket(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := New(reg).Route("x")
	r.ObserveDuration(0.002, "first")
	r.ObserveDuration(0.002, "second") // the same bucket, within exemplarEvery: no exemplar
	r.ObserveDuration(3, "third")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[float64]string{}
	var count uint64
	for _, mf := range mfs {
		if mf.GetName() != "gateway_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			count += m.GetHistogram().GetSampleCount()
			for _, b := range m.GetHistogram().GetBucket() {
				if e := b.GetExemplar(); e != nil {
					got[b.GetUpperBound()] = e.GetLabel()[0].GetValue()
				}
			}
		}
	}
	if count != 3 || got[0.0025] != "first" || got[5] != "third" || len(got) != 2 {
		t.Fatalf("count %d, exemplars by bucket %v", count, got)
	}
}
