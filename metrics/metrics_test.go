package metrics

import (
	"testing"

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
		{"gateway_breaker_open", []string{"node", "10.0.0.1:6379"}, 1},
		{"gateway_breaker_open", []string{"node", "10.0.0.2:6379"}, 0},
		{"gateway_breaker_open", []string{"node", "10.0.0.3:6379"}, -1}, // left the layout
		{"gateway_token_limit_near_total", []string{"route", "agent_job", "limit", "tokens_per_org"}, 1},
		{"gateway_token_limit_near_total", []string{"route", "agent_job", "limit", "agent_job_per_project"}, -1},
		{"gateway_stream_tokens_total", []string{"route", "agent_job", "org", "acme", "kind", "prompt"}, 15},
		{"gateway_stream_tokens_total", []string{"route", "agent_job", "org", "acme", "kind", "completion"}, 30},
		{"gateway_stream_tokens_estimated_total", []string{"route", "agent_job", "kind", "prompt"}, 8},
		{"gateway_stream_tokens_estimated_total", []string{"route", "agent_job", "kind", "completion"}, 2},
		{"gateway_limiter_errors_total", []string{"kind", "node"}, 1},
		{"gateway_limiter_errors_total", []string{"kind", "data"}, 0}, // created at 0
		{"gateway_ratelimit_refunds_total", []string{"limit", "agent_job_per_project", "reason", "upstream_401"}, 1},
		{"gateway_streams_stalled_total", []string{"route", "assistant_message"}, 1},
		{"gateway_streams_stalled_total", []string{"route", "assistant_message_v2"}, 0}, // created at 0
		{"gateway_streams_stalled_total", []string{"route", "agent_job"}, -1},           // no stream route
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
