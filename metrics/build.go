package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The process's own facts: what was built, and whether the config file in force is the last
// one read.

type process struct {
	buildInfo  *prometheus.GaugeVec
	reloadOK   prometheus.Gauge
	reloadTime prometheus.Gauge
}

func newProcess() process {
	return process{
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gateway_build_info",
			Help: "Always 1, labelled with the running binary's version (set at build time), its VCS revision and the Go version it was built with.",
		}, []string{"version", "revision", "goversion"}),
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gateway_config_last_reload_successful",
			Help: "1 when the last attempt to load the config file (at start, SIGHUP or POST /reload) applied; 0 when it was rejected and an older config is still in force.",
		}),
		reloadTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gateway_config_last_reload_success_timestamp_seconds",
			Help: "Unix time at which the config in force was loaded: at start, then at each reload that applied.",
		}),
	}
}

func (p process) collectors() []prometheus.Collector {
	return []prometheus.Collector{p.buildInfo, p.reloadOK, p.reloadTime}
}

// Build sets gateway_build_info: the one series of this binary, at 1.
func (m *Metrics) Build(version, revision, goversion string) {
	m.process.buildInfo.Reset()
	m.process.buildInfo.WithLabelValues(version, revision, goversion).Set(1)
}

// ConfigLoaded records an attempt to load the config file: applied at time at, or rejected
// (the config in force, and its timestamp, stay).
func (m *Metrics) ConfigLoaded(applied bool, at time.Time) {
	if !applied {
		m.process.reloadOK.Set(0)
		return
	}
	m.process.reloadOK.Set(1)
	m.process.reloadTime.Set(float64(at.UnixNano()) / 1e9)
}
