package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/limits"
)

func parse(t *testing.T, yaml string, env map[string]string) (*Config, error) {
	t.Helper()
	return Parse(strings.NewReader(yaml), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
}

func TestExampleConfigLoads(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	cfg, err := Load(filepath.Join(filepath.Dir(file), "..", "config.example.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Upstream.URL != "http://127.0.0.1:9000" || cfg.Listen != ":8080" || len(cfg.Routes) != 4 {
		t.Fatalf("unexpected example config: %+v", cfg)
	}
	// The example documents the defaults: loading it must give the same values.
	d := Defaults()
	if cfg.Upstream.URL != "http://127.0.0.1:9000" || cfg.Upstream.Timeout != d.Upstream.Timeout ||
		cfg.Upstream.DialTimeout != d.Upstream.DialTimeout || cfg.Upstream.MaxIdleConns != d.Upstream.MaxIdleConns ||
		cfg.Upstream.IdleTimeout != d.Upstream.IdleTimeout || cfg.Upstream.Transport != d.Upstream.Transport || cfg.Server != d.Server || cfg.MaxBodyBytes != d.MaxBodyBytes ||
		cfg.Redis.Timeout != d.Redis.Timeout || cfg.Redis.OnError != d.Redis.OnError || cfg.Auth != d.Auth ||
		cfg.ClientIP.IPv6Prefix != d.ClientIP.IPv6Prefix || cfg.Log != d.Log || cfg.AdminMaxExports != d.AdminMaxExports {
		t.Fatalf("example and defaults disagree: %+v vs %+v", cfg.Server, d.Server)
	}
}

func TestMinimalConfigGetsDefaults(t *testing.T) {
	cfg, err := parse(t, "upstream:\n  url: http://up:9000\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AdminListen != "127.0.0.1:9090" || cfg.Upstream.Timeout != 30*time.Second || cfg.MaxBodyBytes != 1<<20 ||
		cfg.Server.ShutdownGrace != 30*time.Second || cfg.CORS.AllowedOrigins[0] != "*" ||
		cfg.Upstream.IdleTimeout != 50*time.Second || cfg.AdminMaxExports != 2 || cfg.Server.WriteStallTimeout != 10*time.Second {
		t.Fatalf("defaults not applied: %+v", cfg)
	}
}

// server.write_stall_timeout: 0 turns the bound off; any duration of a second or more is kept.
func TestWriteStallTimeout(t *testing.T) {
	for yaml, want := range map[string]time.Duration{"0s": 0, "1s": time.Second, "2m": 2 * time.Minute} {
		cfg, err := parse(t, "upstream: {url: 'http://a'}\nserver: {write_stall_timeout: "+yaml+"}\n", nil)
		if err != nil || cfg.Server.WriteStallTimeout != want {
			t.Errorf("%s: %v %v, want %v", yaml, err, cfg, want)
		}
	}
}

func TestEnvOverrides(t *testing.T) {
	cfg, err := parse(t, "listen: ':1'\nupstream: {url: 'http://a:1'}\n",
		map[string]string{"GATEWAY_UPSTREAM_URL": "https://b.example", "GATEWAY_LISTEN": "127.0.0.1:7000"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Upstream.URL != "https://b.example" || cfg.Listen != "127.0.0.1:7000" {
		t.Fatalf("env not applied: %s %s", cfg.Upstream.URL, cfg.Listen)
	}
	// The URL may come from the environment alone.
	if _, err := parse(t, "", map[string]string{"GATEWAY_UPSTREAM_URL": "http://c:1"}); err != nil {
		t.Fatal(err)
	}
}

func TestErrorsNameTheKey(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"", "upstream.url: is required"},
		{"upstream: {url: 'http://a'}\nlisten_port: 80\n", "listen_port: unknown key"},
		{"upstream: {url: 'http://a', timout: 3s}\n", "upstream.timout: unknown key"},
		{"upstream: {url: 'ftp://a'}\n", "upstream.url: \"ftp://a\" must start with http:// or https://"},
		{"upstream: {url: 'http://'}\n", "upstream.url: \"http://\" has no host"},
		{"upstream: {url: ':::'}\n", "upstream.url:"},
		{"upstream: {url: 'http://a', timeout: soon}\n", "upstream.timeout: cannot use \"soon\" here: want a duration"},
		{"upstream: {url: 'http://a', timeout: -1s}\n", "upstream.timeout: must be a positive duration"},
		{"upstream: {url: 'http://a', idle_timeout: 0s}\n", "upstream.idle_timeout: must be a positive duration"},
		{"upstream: {url: 'http://a', idle_timeout: 5}\n", "upstream.idle_timeout: cannot use \"5\" here: want a duration"},
		{"upstream: {url: 'http://a', transport: fast}\n", "upstream.transport: \"fast\" is not pool or standard"},
		{"upstream: {url: 'http://a'}\nmax_body_bytes: lots\n", "max_body_bytes: cannot use \"lots\" here: want a whole number"},
		{"upstream: {url: 'http://a'}\nmax_body_bytes: 0\n", "max_body_bytes: must be a positive"},
		{"upstream: {url: 'http://a'}\nlisten: 8080\n", "listen: \"8080\" is not host:port"},
		{"upstream: {url: 'http://a'}\nadmin_listen: ':8080'\n", "admin_listen: must differ from listen"},
		{"upstream: {url: 'http://a'}\nadmin_max_exports: 0\n", "admin_max_exports: must be at least 1"},
		{"upstream: {url: 'http://a'}\nadmin_max_exports: many\n", "admin_max_exports: cannot use \"many\" here: want a whole number"},
		{"upstream: {url: 'http://a'}\nclient_ip: {trusted_proxies: [10.0.0.0/33]}\n", "client_ip.trusted_proxies[0]:"},
		{"upstream: {url: 'http://a'}\ncors: {allowed_origins: ['https://a.com/path']}\n", "cors.allowed_origins[0]:"},
		{"upstream: {url: 'http://a'}\nlog: {level: loud}\n", "log.level: \"loud\""},
		{"upstream: {url: 'http://a'}\nserver: {write_stall_timeout: -1s}\n", "server.write_stall_timeout: -1s: must be at least 1s (0 turns it off)"},
		{"upstream: {url: 'http://a'}\nserver: {write_stall_timeout: 500ms}\n", "server.write_stall_timeout: 500ms: must be at least 1s"},
		{"upstream: {url: 'http://a'}\ntls: {cert_file: a.pem}\n", "tls.key_file: is required"},
		{"upstream: {url: 'http://a'}\nroutes: [{name: Bad-Name, method: get, path: x, key: root}]\n", "routes[0].name:"},
		{"upstream: {url: 'http://a'}\nroutes: [{name: a, method: GET, path: /a, key: admin, stream: maybe}]\n", "routes[0].stream: cannot use \"maybe\""},
		{"upstream: {url: 'http://a'}\nroutes: {name: a}\n", "routes: must be a list"},
		{"upstream: {url: 'http://a'}\nupstream: {url: 'http://b'}\n", "upstream: appears twice"},
		{"upstream: [\n", "not valid YAML"},
		// Limits a store cannot count exactly, named where they are set.
		{"upstream: {url: 'http://a'}\nlimits: {agent_job_per_project: {limit: 1000000000000000000}}\n",
			"limits.agent_job_per_project.limit: 1000000000000000000 is above 9007199254740991 (2^53 − 1)"},
		{"upstream: {url: 'http://a'}\nlimits: {x: {limit: 3600000001, window: hour, by: ip, algorithm: gcra}}\n",
			"limits.x.limit: 3600000001 is above 3600000000, the largest GCRA limit for window hour"},
		{"upstream: {url: 'http://a'}\nplans: {gold: {assistant_per_key: {limit: 9007199254740992}}}\n",
			"plans.gold.assistant_per_key.limit: 9007199254740992 is above"},
		{"upstream: {url: 'http://a'}\nlimits: {assistant_per_org: {limit: 5000000}}\nplans: {gold: {assistant_per_org: {algorithm: gcra, window: 1s}}}\n",
			"plans.gold.assistant_per_org: 5000000 is above 1000000, the largest GCRA limit for window 1s"},
		// History, per limit and per plan.
		{"upstream: {url: 'http://a'}\nlimits: {agent_job_per_project: {history: -1}}\n",
			"limits.agent_job_per_project.history: -1 is not a number of windows from 0 to 400"},
		{"upstream: {url: 'http://a'}\nplans: {gold: {assistant_per_key: {history: 401}}}\n",
			"plans.gold.assistant_per_key.history: 401 is not a number of windows from 0 to 400"},
		{"upstream: {url: 'http://a'}\nlimits: {x: {limit: 5, window: hour, by: ip, algorithm: gcra, history: 3}}\n",
			"limits.x.history: a gcra limit has no windows to keep"},
		{"upstream: {url: 'http://a'}\nlimits: {agent_job_per_project: {history: many}}\n",
			"limits.agent_job_per_project.history: cannot use \"many\" here: want a whole number"},
	}
	for _, c := range cases {
		_, err := parse(t, c.yaml, nil)
		var ce *Error
		if !errors.As(err, &ce) {
			t.Errorf("%q: error %v is not a config error", c.yaml, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
			t.Errorf("%q:\n got %q\nwant a single line containing %q", c.yaml, msg, c.want)
		}
	}
}

// The largest limits a store counts exactly are accepted: 2^53 − 1, and for GCRA one unit per
// microsecond of the window.
func TestLargestLimitsAccepted(t *testing.T) {
	if _, err := parse(t, "upstream: {url: 'http://a'}\nlimits: {agent_job_per_project: {limit: 9007199254740991},"+
		" x: {limit: 3600000000, window: hour, by: ip, algorithm: gcra}}\n", nil); err != nil {
		t.Fatal(err)
	}
}

func TestAllProblemsReportedAtOnce(t *testing.T) {
	_, err := parse(t, "upstream: {url: 'ftp://a', timeout: 0s}\nmax_body_bytes: -1\n", nil)
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, key := range []string{"upstream.url", "upstream.timeout", "max_body_bytes"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("%q not reported in %v", key, err)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), nil)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("upstream: {url: 'http://a'}\n")
	f.Add("listen: ':1'\nroutes: [{name: a, method: GET, path: /x, key: admin, stream: true}]\nupstream: {url: 'http://a'}")
	f.Add("upstream: &a {url: 'http://a'}\nserver: *a\n")
	f.Fuzz(func(t *testing.T, s string) {
		cfg, err := Parse(strings.NewReader(s), nil)
		if err == nil && cfg.Validate() != nil {
			t.Fatalf("Parse accepted a config Validate rejects: %q", s)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("multi-line error for %q: %q", s, err)
		}
	})
}

// A limit's history: the window's default, else its own, and a plan's over both (a plan that
// changes the window without setting history takes the new window's default).
func TestHistoryResolved(t *testing.T) {
	c, err := parse(t, "upstream: {url: 'http://a'}\nlimits: {assistant_per_org: {history: 5}, x: {limit: 1, window: 10s, by: ip}}\n"+
		"plans: {gold: {assistant_per_org: {history: 2}, assistant_per_key: {window: day}, x: {history: 0}}}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, plan := range []string{"", "gold"} {
		for _, s := range c.PlanLimits(plan) {
			w, err := limits.ParseWindow(s.Window)
			if err != nil {
				t.Fatal(err)
			}
			got[plan+"/"+s.Name] = s.HistoryOf(w)
		}
	}
	want := map[string]int{
		"/agent_job_per_project": 48, "/assistant_per_ip": 35, "/assistant_per_key": 13, "/assistant_per_org": 5, "/x": 10,
		"gold/agent_job_per_project": 48, "gold/assistant_per_ip": 35, "gold/assistant_per_key": 35, "gold/assistant_per_org": 2, "gold/x": 0,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("history\n got %v\nwant %v", got, want)
	}
}
