package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Renames are the metrics renamed so that each concern has one prefix (gateway_ratelimit_ for
// limits and the limiter's Redis calls, gateway_stream_ for streamed answers). For one release
// each old name is still exported beside the new one, with the same labels and values and a
// help text that says it is deprecated; the release after removes it.
func Renames() []Rename {
	return []Rename{
		{Old: "gateway_limiter_duration_seconds", New: "gateway_ratelimit_decision_duration_seconds"},
		{Old: "gateway_limiter_errors_total", New: "gateway_ratelimit_decision_errors_total"},
		{Old: "gateway_breaker_open", New: "gateway_ratelimit_breaker_open"},
		{Old: "gateway_token_limit_near_total", New: "gateway_ratelimit_tokens_near_limit_total"},
		{Old: "gateway_token_holds_expired_total", New: "gateway_ratelimit_holds_expired_total"},
		{Old: "gateway_streams_stalled_total", New: "gateway_stream_stalled_total"},
	}
}

// Rename is one renamed metric.
type Rename struct{ Old, New string }

// deprecated re-exports the series of src under an old name, read at scrape time: the request
// path updates only the new series.
type deprecated struct {
	desc   *prometheus.Desc
	src    prometheus.Collector
	labels []string // src's variable labels, in their order
}

func newDeprecated(r Rename, src prometheus.Collector, labels ...string) *deprecated {
	help := "Deprecated: use " + r.New + "; removed in the next release."
	return &deprecated{desc: prometheus.NewDesc(r.Old, help, labels, nil), src: src, labels: labels}
}

func (d *deprecated) Describe(ch chan<- *prometheus.Desc) { ch <- d.desc }

func (d *deprecated) Collect(ch chan<- prometheus.Metric) {
	in := make(chan prometheus.Metric)
	go func() {
		d.src.Collect(in)
		close(in)
	}()
	for m := range in {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			continue
		}
		values := make([]string, len(d.labels))
		for i, name := range d.labels {
			for _, lp := range pb.GetLabel() {
				if lp.GetName() == name {
					values[i] = lp.GetValue()
				}
			}
		}
		switch {
		case pb.Counter != nil:
			ch <- prometheus.MustNewConstMetric(d.desc, prometheus.CounterValue, pb.GetCounter().GetValue(), values...)
		case pb.Gauge != nil:
			ch <- prometheus.MustNewConstMetric(d.desc, prometheus.GaugeValue, pb.GetGauge().GetValue(), values...)
		case pb.Histogram != nil:
			h := pb.GetHistogram()
			buckets := make(map[float64]uint64, len(h.GetBucket()))
			for _, b := range h.GetBucket() {
				buckets[b.GetUpperBound()] = b.GetCumulativeCount()
			}
			ch <- prometheus.MustNewConstHistogram(d.desc, h.GetSampleCount(), h.GetSampleSum(), buckets, values...)
		}
	}
}

// deprecatedCollectors are the old names of m's renamed collectors.
func (m *Metrics) deprecatedCollectors() []prometheus.Collector {
	src := map[string]struct {
		c      prometheus.Collector
		labels []string
	}{
		"gateway_ratelimit_decision_duration_seconds": {m.limiterDuration, nil},
		"gateway_ratelimit_decision_errors_total":     {m.limiterErrors, []string{"kind"}},
		"gateway_ratelimit_breaker_open":              {m.breakerOpen, []string{"node"}},
		"gateway_ratelimit_tokens_near_limit_total":   {m.tokenLimitNear, []string{"route", "limit"}},
		"gateway_ratelimit_holds_expired_total":       {m.holdsExpired, []string{"limit"}},
		"gateway_stream_stalled_total":                {m.streamsStalled, []string{"route"}},
	}
	var out []prometheus.Collector
	for _, r := range Renames() {
		s := src[r.New]
		out = append(out, newDeprecated(r, s.c, s.labels...))
	}
	return out
}
