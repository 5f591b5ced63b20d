package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Secrets of the right form: whsec_ and the base64 of 24 and 32 bytes.
const (
	secretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretB = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
)

const hookBase = "upstream: {url: 'http://a'}\n"

func TestNotificationsDefaults(t *testing.T) {
	c, err := parse(t, hookBase, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := c.Notifications
	if n.Enabled() || n.Timeout != 5*time.Second || n.MaxBackoff != 5*time.Minute || n.RetryFor != 24*time.Hour {
		t.Fatalf("defaults: %+v", n)
	}
	for _, s := range c.ResolvedLimits() {
		if s.Thresholds != nil || s.Forecast {
			t.Fatalf("%s has thresholds or forecast without notifications: %+v", s.Name, s)
		}
	}

	c, err = parse(t, hookBase+"notifications: {webhooks: [{name: billing, url: 'https://hooks.example.com/gw', secret: "+secretA+"}]}\n"+
		"limits:\n"+
		"  quiet: {limit: 10, window: hour, by: org, thresholds: []}\n"+
		"  smooth: {limit: 10, window: hour, by: org, algorithm: gcra}\n"+
		"  live: {limit: 10, by: org, unit: streams}\n"+
		"  custom: {limit: 10, window: day, by: key, thresholds: [0.5, 0.9, 1], forecast: true}\n"+
		"  exhaust_only: {limit: 10, window: day, by: org, events: [quota.exhausted]}\n"+
		"  visitor_set: {limit: 10, window: day, by: ip, thresholds: [0.5]}\n"+
		"  visitor_events: {limit: 10, window: day, by: ip, events: [quota.threshold_crossed, quota.exhausted]}\n"+
		"  visitor_forecast: {limit: 10, window: day, by: ip, forecast: true}\n"+
		"plans: {gold: {custom: {thresholds: [0.75]}, assistant_per_org: {forecast: true}, assistant_per_ip: {thresholds: [0.9]}, visitor_events: {events: []}}}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	w := c.Notifications.Webhooks[0]
	if !c.Notifications.Enabled() || w.Events != nil || w.Limits != nil || len(w.Keys) != 1 || len(w.Keys[0]) != 24 {
		t.Fatalf("webhook: events %v limits %v, %d keys", w.Events, w.Limits, len(w.Keys))
	}
	get := func(plan, name string) LimitSpec {
		for _, s := range c.PlanLimits(plan) {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no %s in plan %q", name, plan)
		return LimitSpec{}
	}
	const th, ex, fc = EventThresholdCrossed, EventExhausted, EventForecast
	for _, tc := range []struct {
		plan, name string
		thresholds []float64
		forecast   bool
		events     []string
	}{
		{"", "assistant_per_org", []float64{0.8, 1}, false, []string{th, ex}},
		{"gold", "assistant_per_org", []float64{0.8, 1}, true, []string{th, ex, fc}},
		{"", "quiet", []float64{}, false, []string{ex}},
		{"", "smooth", nil, false, nil},
		{"", "live", nil, false, nil},
		{"", "custom", []float64{0.5, 0.9, 1}, true, []string{th, ex, fc}},
		{"gold", "custom", []float64{0.75}, true, []string{th, ex, fc}},
		{"", "exhaust_only", nil, false, []string{ex}},
		// A visitor's limit (by ip) sends only what it sets: the defaults make no events.
		{"", "assistant_per_ip", nil, false, []string{}},
		{"gold", "assistant_per_ip", []float64{0.9}, false, []string{th}},
		{"", "visitor_set", []float64{0.5}, false, []string{th}},
		{"", "visitor_events", []float64{0.8, 1}, false, []string{th, ex}},
		{"gold", "visitor_events", nil, false, []string{}},
		{"", "visitor_forecast", nil, true, []string{fc}},
	} {
		s := get(tc.plan, tc.name)
		if !slices.Equal(s.Thresholds, tc.thresholds) || s.Forecast != tc.forecast || !slices.Equal(s.Events, tc.events) {
			t.Errorf("plan %q %s: thresholds %v forecast %v events %v, want %v %v %v", tc.plan, tc.name, s.Thresholds, s.Forecast, s.Events, tc.thresholds, tc.forecast, tc.events)
		}
	}
}

// Every problem names its key; no message repeats a secret, whatever the source.
func TestNotificationsRefused(t *testing.T) {
	hook := func(fields string) string {
		return hookBase + "notifications: {webhooks: [{name: h, url: 'https://hooks.example.com/x', " + fields + "}]}\n"
	}
	const secretText = "whsec_c2hvcnQ=" // 5 bytes: refused, and never to be echoed
	cases := []struct{ yaml, want string }{
		{hook("secret: " + secretA + ", secret_env: X"), "notifications.webhooks[0]: needs exactly one of secret, secret_file and secret_env (2 set)"},
		{hook("events: [quota.forecast]"), "notifications.webhooks[0]: needs exactly one of secret, secret_file and secret_env (0 set)"},
		{hook("secret: " + secretText), "notifications.webhooks[0].secret: secret 1 of 1 holds 5 bytes: want 24 to 64 random bytes"},
		{hook("secret: 'not-a-whsec-secret-at-all-123456'"), "notifications.webhooks[0].secret: secret 1 of 1 does not start with whsec_"},
		{hook("secret: '" + secretA + " whsec_%%%'"), "notifications.webhooks[0].secret: secret 2 of 2 is not whsec_ followed by standard base64"},
		{hook("secret_env: '1X'"), "notifications.webhooks[0].secret_env: \"1X\" is not an environment variable name"},
		{hookBase + "notifications: {webhooks: [{name: h, url: 'ftp://h/x', secret: " + secretA + "}]}\n", "notifications.webhooks[0].url: must start with http:// or https://"},
		{hookBase + "notifications: {webhooks: [{name: h, url: 'https://u:pw@h/x', secret: " + secretA + "}]}\n", "notifications.webhooks[0].url: must not carry credentials"},
		{hookBase + "notifications: {webhooks: [{name: h, url: 'https:///x', secret: " + secretA + "}]}\n", "notifications.webhooks[0].url: has no host"},
		{hookBase + "notifications: {webhooks: [{name: h, secret: " + secretA + "}]}\n", "notifications.webhooks[0].url: is required"},
		{hookBase + "notifications: {webhooks: [{name: Bad, url: 'http://h', secret: " + secretA + "}]}\n", "notifications.webhooks[0].name: \"Bad\" must be lower_snake_case"},
		{hookBase + "notifications: {webhooks: [{name: h, url: 'http://h', secret: " + secretA + "}, {name: h, url: 'http://h', secret: " + secretA + "}]}\n", "notifications.webhooks[1].name: \"h\" is used by another webhook"},
		{hook("secret: " + secretA + ", events: [quota.sold_out]"), "notifications.webhooks[0].events[0]: \"quota.sold_out\" is not one of quota.threshold_crossed"},
		{hook("secret: " + secretA + ", events: [ping]"), "notifications.webhooks[0].events[0]: ping is sent only by the test command"},
		{hook("secret: " + secretA + ", events: [quota.exhausted, quota.exhausted]"), "notifications.webhooks[0].events[1]: \"quota.exhausted\" is listed twice"},
		{hook("secret: " + secretA + ", events: []"), "notifications.webhooks[0].events: is empty"},
		{hook("secret: " + secretA + ", limits: [nope]"), "notifications.webhooks[0].limits[0]: \"nope\" is not a defined limit"},
		{hook("secret: " + secretA + ", limits: []"), "notifications.webhooks[0].limits: is empty"},
		{hookBase + "notifications: {timeout: 0s}\n", "notifications.timeout: must be a positive duration"},
		{hookBase + "notifications: {max_backoff: 500ms}\n", "notifications.max_backoff: 500ms: must be at least 1s"},
		{hookBase + "notifications: {retry_for: -1s}\n", "notifications.retry_for: must be a positive duration"},
		{hookBase + "limits: {assistant_per_org: {thresholds: [0.8]}}\n", "limits.assistant_per_org.thresholds: has no effect without notifications.webhooks"},
		{hookBase + "limits: {assistant_per_org: {forecast: true}}\n", "limits.assistant_per_org.forecast: has no effect without notifications.webhooks"},
		{hook("secret: "+secretA) + "limits: {assistant_per_org: {thresholds: [0, 0.5]}}\n", "limits.assistant_per_org.thresholds[0]: 0 is not a fraction of the limit in (0, 1]"},
		{hook("secret: "+secretA) + "limits: {assistant_per_org: {thresholds: [0.5, 1.5]}}\n", "limits.assistant_per_org.thresholds[1]: 1.5 is not a fraction"},
		{hook("secret: "+secretA) + "limits: {assistant_per_org: {thresholds: [0.9, 0.8]}}\n", "limits.assistant_per_org.thresholds[1]: 0.8: thresholds are listed in increasing order, each once"},
		{hook("secret: "+secretA) + "limits: {assistant_per_org: {thresholds: [0.8, 0.8]}}\n", "limits.assistant_per_org.thresholds[1]: 0.8: thresholds are listed in increasing order"},
		{hook("secret: "+secretA) + "limits: {assistant_per_org: {thresholds: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]}}\n", "limits.assistant_per_org.thresholds: lists 9: at most 8"},
		{hook("secret: "+secretA) + "limits: {assistant_per_org: {thresholds: [half]}}\n", "limits.assistant_per_org.thresholds: cannot use"},
		{hook("secret: "+secretA) + "limits: {g: {limit: 5, window: hour, by: org, algorithm: gcra, thresholds: [0.5]}}\n", "limits.g.thresholds: only a fixed-window requests or tokens limit crosses thresholds (a gcra limit has no windows)"},
		{hook("secret: "+secretA) + "limits: {s: {limit: 5, by: org, unit: streams, forecast: true}}\n", "limits.s.forecast: only a fixed-window requests or tokens limit has a burn rate to forecast (a streams limit counts answers in flight)"},
		{hook("secret: "+secretA) + "plans: {gold: {assistant_per_org: {thresholds: [2]}}}\n", "plans.gold.assistant_per_org.thresholds[0]: 2 is not a fraction"},
		{hook("secret: "+secretA) + "plans: {gold: {assistant_per_org: {algorithm: gcra, forecast: true}}}\n", "plans.gold.assistant_per_org.forecast: only a fixed-window"},
		{hook("secret: " + secretA + ", unknown: 1"), "notifications.webhooks[0].unknown: unknown key"},
		// A chat webhook's URL carries its token: never echoed.
		{hookBase + "notifications: {webhooks: [{name: h, url: 'ftp://h/services/pw@x?token=pw@', secret: " + secretA + "}]}\n", "notifications.webhooks[0].url: must start with http:// or https://"},
		{hook("secret: "+secretA) + "limits: {assistant_per_org: {thresholds: [0.8, 0.8000001]}}\n", "limits.assistant_per_org.thresholds[1]: 0.8000001: thresholds are listed in increasing order, each once (to a millionth)"},
		{hookBase + "limits: {assistant_per_ip: {events: [quota.exhausted]}}\n", "limits.assistant_per_ip.events: has no effect without notifications.webhooks"},
		{hook("secret: "+secretA) + "limits: {assistant_per_ip: {events: [key.revoked]}}\n", "limits.assistant_per_ip.events[0]: \"key.revoked\" is not one of quota.threshold_crossed, quota.exhausted, quota.forecast"},
		{hook("secret: "+secretA) + "limits: {assistant_per_ip: {events: [quota.exhausted, quota.exhausted]}}\n", "limits.assistant_per_ip.events[1]: \"quota.exhausted\" is listed twice"},
		{hook("secret: "+secretA) + "limits: {assistant_per_ip: {events: [quota.forecast]}}\n", "limits.assistant_per_ip.events[0]: quota.forecast is sent only with forecast: true"},
		{hook("secret: "+secretA) + "limits: {assistant_per_ip: {events: [quota.threshold_crossed], thresholds: []}}\n", "limits.assistant_per_ip.events[0]: quota.threshold_crossed needs thresholds"},
		{hook("secret: "+secretA) + "limits: {s: {limit: 5, by: ip, unit: streams, events: [quota.exhausted]}}\n", "limits.s.events[0]: only a fixed-window requests or tokens limit sends quota events (a streams limit counts answers in flight)"},
		{hook("secret: "+secretA) + "limits: {assistant_per_org: {events: [quota.exhausted], thresholds: [0.5]}}\n", "limits.assistant_per_org.thresholds: are never sent: the limit's events do not list quota.threshold_crossed"},
		{hook("secret: "+secretA) + "limits: {assistant_per_org: {events: [quota.exhausted], forecast: true}}\n", "limits.assistant_per_org.forecast: is never sent: the limit's events do not list quota.forecast"},
		{hook("secret: "+secretA) + "limits: {assistant_per_org: {events: [quota.exhausted]}}\nplans: {gold: {assistant_per_org: {thresholds: [0.5]}}}\n", "plans.gold.assistant_per_org.thresholds: are never sent"},
		{hook("secret: "+secretA) + "plans: {gold: {assistant_per_ip: {events: [quota.sold_out]}}}\n", "plans.gold.assistant_per_ip.events[0]: \"quota.sold_out\" is not one of"},
	}
	for _, c := range cases {
		_, err := parse(t, c.yaml, nil)
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%q: got %v, want a config error", c.yaml, err)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n got %v\nwant %s", c.yaml, err, c.want)
		}
		for _, s := range []string{secretA[len(SecretPrefix):], "c2hvcnQ", "pw@"} {
			if strings.Contains(err.Error(), s) {
				t.Errorf("%q: the error repeats a secret: %v", c.yaml, err)
			}
		}
	}
}

// secret_file and secret_env are read at load; several secrets (a rotation) all sign. A source
// that is missing or holds a malformed secret is refused without repeating what it holds.
func TestWebhookSecretSources(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "hook.secret")
	if err := os.WriteFile(file, []byte(secretB+"\n"+secretA+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := hookBase + "notifications:\n  webhooks:\n" +
		"    - {name: from_file, url: 'https://hooks.example.com/a', secret_file: '" + file + "'}\n" +
		"    - {name: from_env, url: 'https://hooks.example.com/b', secret_env: HOOK_SECRET}\n" +
		"    - {name: inline, url: 'https://hooks.example.com/c', secret: '" + secretA + " " + secretB + "'}\n"
	c, err := parse(t, yaml, map[string]string{"HOOK_SECRET": " " + secretA + " "})
	if err != nil {
		t.Fatal(err)
	}
	counts := []int{2, 1, 2}
	for i, w := range c.Notifications.Webhooks {
		if len(w.Keys) != counts[i] {
			t.Fatalf("%s: %d keys, want %d", w.Name, len(w.Keys), counts[i])
		}
	}
	if len(c.Notifications.Webhooks[0].Keys[0]) != 32 || len(c.Notifications.Webhooks[1].Keys[0]) != 24 {
		t.Fatal("keys not decoded")
	}

	bad := filepath.Join(dir, "bad.secret")
	if err := os.WriteFile(bad, []byte("whsec_c2hvcnQ=\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		yaml string
		env  map[string]string
		want string
	}{
		{hookBase + "notifications: {webhooks: [{name: h, url: 'http://h', secret_env: HOOK_SECRET}]}\n", nil,
			"notifications.webhooks[0].secret_env: the environment variable HOOK_SECRET is not set"},
		{hookBase + "notifications: {webhooks: [{name: h, url: 'http://h', secret_env: HOOK_SECRET}]}\n", map[string]string{"HOOK_SECRET": "plain-password-123"},
			"notifications.webhooks[0].secret_env: secret 1 of 1 does not start with whsec_"},
		{hookBase + "notifications: {webhooks: [{name: h, url: 'http://h', secret_file: '" + filepath.Join(dir, "missing") + "'}]}\n", nil,
			"notifications.webhooks[0].secret_file: cannot read " + filepath.Join(dir, "missing") + ": no such file or directory"},
		{hookBase + "notifications: {webhooks: [{name: h, url: 'http://h', secret_file: '" + bad + "'}]}\n", nil,
			"notifications.webhooks[0].secret_file: secret 1 of 1 holds 5 bytes"},
	} {
		_, err := parse(t, tc.yaml, tc.env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %s", err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "plain-password") || strings.Contains(err.Error(), "c2hvcnQ") {
			t.Errorf("the error repeats the secret: %v", err)
		}
	}
}

func TestParseSecrets(t *testing.T) {
	keys, err := ParseSecrets(secretA + "\n\t" + secretB)
	if err != nil || len(keys) != 2 || !bytes.Equal(keys[0][:3], []byte{0x31, 0xf2, 0x90}) {
		t.Fatalf("%x %v", keys, err)
	}
	long := SecretPrefix + strings.Repeat("A", 88) // 66 bytes
	for _, s := range []string{"", "  ", long, SecretPrefix} {
		if _, err := ParseSecrets(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

// A URL naming a loopback, link-local, private, metadata or other non-public address
// literally is refused, naming the address (never the URL) and the opt-in; with the opt-in
// it is accepted. A host name is accepted: it is checked when a delivery connects.
func TestWebhookPrivateAddresses(t *testing.T) {
	hook := func(url, extra string) string {
		return hookBase + "notifications: {webhooks: [{name: h, url: '" + url + "', secret: " + secretA + extra + "}]}\n"
	}
	for url, addr := range map[string]string{
		"http://169.254.169.254/latest/meta-data/?token=t0p": "169.254.169.254 is a cloud metadata address",
		"http://[fe80::1]/":              "fe80::1 is a link-local address",
		"http://[fe80::1%25eth0]:8080/x": "fe80::1 is a link-local address",
		"https://127.0.0.1:8443/hooks":   "127.0.0.1 is a loopback address",
		"http://[::1]/":                  "::1 is a loopback address",
		"http://[::ffff:10.0.0.5]/":      "::ffff:10.0.0.5 is a private address",
		"http://192.168.1.20/":           "192.168.1.20 is a private address",
		"http://[fd00:ec2::254]/":        "fd00:ec2::254 is a cloud metadata address",
		"http://0.0.0.0:9000/":           "0.0.0.0 is an unspecified address",
		"http://100.100.100.200/":        "100.100.100.200 is a cloud metadata address",
	} {
		_, err := parse(t, hook(url, ""), nil)
		if err == nil || !strings.Contains(err.Error(), "notifications.webhooks[0].url: "+addr) ||
			!strings.Contains(err.Error(), "allow_private_addresses: true") || strings.Contains(err.Error(), "meta-data") {
			t.Errorf("%s: %v", url, err)
		}
		c, err := parse(t, hook(url, ", allow_private_addresses: true"), nil)
		if err != nil || !c.Notifications.Webhooks[0].AllowPrivateAddresses {
			t.Errorf("%s with the opt-in: %v", url, err)
		}
	}
	for _, url := range []string{"https://hooks.example.com/x", "http://localhost:9000/", "http://8.8.8.8/", "http://[2606:4700:4700::1111]/"} {
		if _, err := parse(t, hook(url, ""), nil); err != nil {
			t.Errorf("%s: %v", url, err)
		}
	}
}
