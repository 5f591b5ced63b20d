package config

import (
	"strings"
	"testing"
)

// A password written into a URL-like value never comes back in a message, whatever key holds
// it and however the value is refused; the rest of the message still names the key.
func TestProblemsRedactCredentials(t *testing.T) {
	const secret = "S3cretPa55"
	cases := []struct{ yaml, key string }{
		{"upstream: {url: 'http://a'}\nredis: {addrs: ['redis://default:" + secret + "@host:6379']}\n", "redis.addrs[0]"},
		{"upstream: {url: 'http://a'}\nredis: {addrs: ['default:" + secret + "@host:6379']}\n", "redis.addrs[0]"},
		{"upstream: {url: 'http://user:" + secret + "@host:80:80'}\n", "upstream.url"},
		{"upstream: {url: 'ftp://user:" + secret + "@host'}\n", "upstream.url"},
		{"upstream: {url: 'http://a'}\ncors: {allowed_origins: ['https://u:" + secret + "@x.example/path']}\n", "cors.allowed_origins[0]"},
		{"upstream: {url: 'http://a'}\nroutes: [{name: a, method: POST, path: /a, key: admin, deprecation: {since: 2025-01-01, link: 'ftp://u:" + secret + "@x'}}]\n", "routes[0].deprecation.link"},
	}
	for _, c := range cases {
		_, err := parse(t, c.yaml, nil)
		if err == nil {
			t.Fatalf("%q accepted", c.yaml)
		}
		msg := err.Error()
		if strings.Contains(msg, secret) || !strings.Contains(msg, c.key) || !strings.Contains(msg, "REDACTED@") {
			t.Errorf("%q: message %q, want %s named and the password redacted", c.yaml, msg, c.key)
		}
	}
}

func TestRedactURLs(t *testing.T) {
	for in, want := range map[string]string{
		`"redis://default:pw@h:1" is not host:port`: `"redis://REDACTED@h:1" is not host:port`,
		`redis://:pw@h:1 and http://u@h`:            `redis://REDACTED@h:1 and http://REDACTED@h`,
		`'user:p@ss@h:1'`:                           `'REDACTED@h:1'`,
		`mail ops@example.com`:                      `mail ops@example.com`,
		`no at sign here: http://h:1`:               `no at sign here: http://h:1`,
	} {
		if got := RedactURLs(in); got != want {
			t.Errorf("RedactURLs(%q) = %q, want %q", in, got, want)
		}
	}
}

// Registry mode keeps keys in Redis or in the keys file; with neither, a reload or restart
// would forget every revocation, so the config is refused, naming both options.
func TestRegistryModeNeedsStorage(t *testing.T) {
	_, err := parse(t, "upstream: {url: 'http://a'}\nauth: {mode: registry}\n", nil)
	if err == nil || !strings.Contains(err.Error(), "redis.addrs") || !strings.Contains(err.Error(), "auth.keys_file") {
		t.Fatalf("registry mode without storage: %v", err)
	}
	for _, ok := range []string{
		"upstream: {url: 'http://a'}\nauth: {mode: registry, keys_file: /tmp/keys.yaml}\n",
		"upstream: {url: 'http://a'}\nauth: {mode: registry}\nredis: {addrs: ['127.0.0.1:6379']}\n",
		"upstream: {url: 'http://a'}\n",
	} {
		if _, err := parse(t, ok, nil); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}

func TestAdminHostsAndTLS(t *testing.T) {
	cfg, err := parse(t, "upstream: {url: 'http://a'}\nadmin_hosts: [gateway-admin.example.com, admin]\nadmin_tls: {cert_file: c.pem, key_file: k.pem}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.AdminHosts) != 2 || cfg.AdminTLS == nil || cfg.AdminTLS.CertFile != "c.pem" {
		t.Fatalf("decoded %+v %+v", cfg.AdminHosts, cfg.AdminTLS)
	}
	for yaml, want := range map[string]string{
		"upstream: {url: 'http://a'}\nadmin_hosts: ['admin.example.com:9090']\n": "admin_hosts[0]:",
		"upstream: {url: 'http://a'}\nadmin_hosts: ['https://admin']\n":          "admin_hosts[0]:",
		"upstream: {url: 'http://a'}\nadmin_hosts: ['']\n":                       "admin_hosts[0]:",
		"upstream: {url: 'http://a'}\nadmin_tls: {cert_file: c.pem}\n":           "admin_tls.key_file: is required",
	} {
		if _, err := parse(t, yaml, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", yaml, err, want)
		}
	}
}

// A value that looks like a secret is masked in every config message, whatever key it was
// pasted under and whichever step refuses it: a webhook secret in secret_env, secret_file,
// events or a timeout, an API key of either family as a value or a key, the admin token (from
// the file or GATEWAY_ADMIN_TOKEN) and the Redis password in another key. The message still
// names the key.
func TestProblemsMaskSecrets(t *testing.T) {
	const (
		hook   = "whsec_+QUd0bGtrZ3RvZ2VuZXJhdGVkc2VjcmV0Zm9ydGVzdHM="
		admin  = "svc_Zx8vQ2mN4pL6rT0yW3aB5cD7eF9gH1jK"
		public = "svc_dsc_Qw3eR5tY7uI9oP1aS3dF5gH7jK9lZ2x"
		token  = "operator-admin-token-7f3a9c"
		redisP = "r3d1s-Pa55w0rd!"
	)
	env := map[string]string{"GATEWAY_ADMIN_TOKEN": token}
	base := "upstream: {url: 'http://a'}\n"
	webhook := func(fields string) string {
		return base + "notifications: {webhooks: [{name: h, url: 'https://hooks.example.com/x', " + fields + "}]}\n"
	}
	cases := []struct {
		yaml, key, secret string
		env               map[string]string
	}{
		{webhook("secret_env: '" + hook + "'"), "notifications.webhooks[0].secret_env", hook, nil},
		{webhook("secret_file: '" + hook + "'"), "notifications.webhooks[0].secret_file", hook, nil},
		{webhook("secret: '" + secretA + "', events: ['" + hook + "']"), "notifications.webhooks[0].events[0]", hook, nil},
		{base + "notifications: {timeout: '" + hook + "'}\n", "notifications.timeout", hook, nil},
		{base + "limits: {agent_job_per_project: {by: " + admin + "}}\n", "limits.agent_job_per_project.by", admin, nil},
		{base + "routes: [{name: a, method: POST, path: /a, key: '" + public + "'}]\n", "routes[0].key", public, nil},
		{base + public + ": 1\n", "unknown key", public, nil},
		{base + "admin_token: " + token + "\nlog: {level: " + token + "}\n", "log.level", token, nil},
		{base + "tracing: {protocol: '" + token + "'}\n", "tracing.protocol", token, env},
		{base + "redis: {password: '" + redisP + "', on_error: '" + redisP + "'}\n", "redis.on_error", redisP, nil},
		{base + "redis: {on_error: '" + redisP + "'}\n", "redis.on_error", redisP, map[string]string{"REDIS_PASSWORD": redisP}},
	}
	for _, c := range cases {
		_, err := parse(t, c.yaml, c.env)
		if err == nil {
			t.Errorf("%q accepted", c.yaml)
			continue
		}
		msg := err.Error()
		// Not the secret, nor the part of it after its prefix.
		rest := c.secret[strings.IndexByte(c.secret, '_')+1:]
		if strings.Contains(msg, c.secret) || strings.Contains(msg, rest[:12]) || !strings.Contains(msg, c.key) || !strings.Contains(msg, "REDACTED") {
			t.Errorf("%q: message %q, want %s named and the secret masked", c.yaml, msg, c.key)
		}
	}
}

func TestRedact(t *testing.T) {
	for _, c := range []struct {
		in      string
		secrets []string
		want    string
	}{
		{`secret_env: "whsec_abc+/=" is not a name`, nil, `secret_env: "whsec_REDACTED" is not a name`},
		{`cannot read whsec_abc: no such file`, nil, `cannot read whsec_REDACTED: no such file`},
		{`"svc_dsc_AbC-_9" and svc_Q and svc_`, nil, `"svc_dsc_REDACTED" and svc_REDACTED and svc_`},
		{`my_svc_limit, whsec_ alone`, nil, `my_svc_limit, whsec_ alone`},
		{`"tok\"en-1234" or tok"en-1234`, []string{`tok"en-1234`}, `"REDACTED" or REDACTED`},
		{`redis://u:pw@h and pass`, []string{"pw", "pas"}, `redis://REDACTED@h and pass`}, // too short to mask
		{`abcdefgh`, []string{"abcd", "abcdefgh"}, `REDACTED`},
	} {
		if got := Redact(c.in, c.secrets...); got != c.want {
			t.Errorf("Redact(%q, %q) = %q, want %q", c.in, c.secrets, got, c.want)
		}
	}
}
