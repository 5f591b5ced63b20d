package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// composeSecrets are the variables compose.yaml must require: no default may stand in for them.
var composeSecrets = []string{"GATEWAY_ADMIN_TOKEN", "REDIS_PASSWORD", "GRAFANA_PASSWORD"}

// interpolate applies compose's variable interpolation to text ($$, $VAR, ${VAR},
// ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}) as docker compose does before
// it starts anything: a required variable that is missing (or empty, with :?) is an error.
func interpolate(text string, env map[string]string) (string, error) {
	re := regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)`)
	var firstErr error
	out := re.ReplaceAllStringFunc(text, func(m string) string {
		if m == "$$" {
			return "$"
		}
		g := re.FindStringSubmatch(m)
		name, op, arg := g[1], g[2], g[3]
		if name == "" {
			name = g[4]
		}
		v, set := env[name]
		switch op {
		case ":-":
			if v == "" {
				return arg
			}
		case "-":
			if !set {
				return arg
			}
		case ":?":
			if v == "" && firstErr == nil {
				firstErr = fmt.Errorf("required variable %s is missing a value: %s", name, arg)
			}
		case "?":
			if !set && firstErr == nil {
				firstErr = fmt.Errorf("required variable %s is missing a value: %s", name, arg)
			}
		}
		return v
	})
	return out, firstErr
}

// The compose stack has no fixed default secrets: without each secret variable it refuses to
// start (every use is ${VAR:?...}), and Prometheus scrapes with the same GATEWAY_ADMIN_TOKEN,
// mounted as a secret file, so changing the token never breaks scraping.
func TestComposeSecrets(t *testing.T) {
	raw, err := os.ReadFile("compose/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Compose interpolates values, not comments.
	var lines []string
	for _, l := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			lines = append(lines, l)
		}
	}
	text := strings.Join(lines, "\n")
	// Every use of a secret variable requires it.
	names := strings.Join(composeSecrets, "|")
	use := regexp.MustCompile(`\$\{(` + names + `)([^}]*)\}|\$(` + names + `)\b`)
	uses := map[string]int{}
	for _, m := range use.FindAllStringSubmatch(text, -1) {
		name := m[1] + m[3]
		uses[name]++
		if !strings.HasPrefix(m[2], ":?") {
			t.Errorf("compose.yaml uses %s without requiring it: %q (want ${%s:?message})", name, m[0], name)
		}
	}
	for _, v := range composeSecrets {
		if uses[v] == 0 {
			t.Errorf("compose.yaml never uses %s", v)
		}
	}
	// Nothing under deploy/ ships a well-known secret.
	_ = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, "_test.go") {
			return err
		}
		data, _ := os.ReadFile(path)
		for _, bad := range []string{"change-me", "changeme", "GF_SECURITY_ADMIN_PASSWORD: admin"} {
			if strings.Contains(string(data), bad) {
				t.Errorf("%s holds the default secret %q", path, bad)
			}
		}
		return nil
	})

	// Without the secrets, compose refuses; with them, the file interpolates and each value
	// lands where it belongs.
	env := map[string]string{"VERSION": "v1"}
	for _, missing := range composeSecrets {
		partial := map[string]string{}
		for _, v := range composeSecrets {
			if v != missing {
				partial[v] = "value-of-" + v
			}
		}
		if _, err := interpolate(text, partial); err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("without %s compose would start: %v", missing, err)
		}
	}
	for _, v := range composeSecrets {
		env[v] = "value-of-" + v
	}
	out, err := interpolate(text, env)
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal([]byte(out), &c); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gateway-1", "gateway-2"} {
		e := c.Services[name].Environment
		if e["GATEWAY_ADMIN_TOKEN"] != env["GATEWAY_ADMIN_TOKEN"] || e["REDIS_PASSWORD"] != env["REDIS_PASSWORD"] {
			t.Errorf("%s: environment %v", name, e)
		}
	}
	if c.Services["grafana"].Environment["GF_SECURITY_ADMIN_PASSWORD"] != env["GRAFANA_PASSWORD"] {
		t.Error("grafana's admin password does not come from GRAFANA_PASSWORD")
	}

	// Prometheus: the gateway job reads the token from a file that is the compose secret
	// holding GATEWAY_ADMIN_TOKEN.
	var prom prometheusConfig
	data, err := os.ReadFile("compose/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &prom); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, sc := range prom.ScrapeConfigs {
		if sc.JobName != "gateway" {
			continue
		}
		found = true
		if sc.Authorization == nil || sc.Authorization.Credentials != "" {
			t.Fatal("the gateway job must not hold a token of its own")
		}
		secret, ok := strings.CutPrefix(sc.Authorization.CredentialsFile, "/run/secrets/")
		if !ok {
			t.Fatalf("credentials_file %q is not a compose secret", sc.Authorization.CredentialsFile)
		}
		mounted := false
		for _, s := range c.Services["prometheus"].Secrets {
			mounted = mounted || s == secret
		}
		if !mounted || c.Secrets[secret].Environment != "GATEWAY_ADMIN_TOKEN" {
			t.Fatalf("secret %q: mounted in prometheus %t, from %q; want GATEWAY_ADMIN_TOKEN", secret, mounted, c.Secrets[secret].Environment)
		}
	}
	if !found {
		t.Fatal("no gateway scrape job in compose/prometheus.yml")
	}
}
