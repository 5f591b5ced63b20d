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
