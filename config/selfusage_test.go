package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// self_usage's defaults, and each refusal naming its key.
func TestSelfUsageConfig(t *testing.T) {
	cfg, err := parse(t, "upstream: {url: 'http://a'}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if su := cfg.SelfUsage; !su.Enabled || su.Path != "/gateway/usage" || su.PerAddressPerMinute != 120 || su.PerKeyPerMinute != 60 || len(su.PrefixModeExposes) != 0 {
		t.Fatalf("defaults: %+v", su)
	}
	cfg, err = parse(t, "upstream: {url: 'http://a'}\nself_usage: {prefix_mode_exposes: [project, key, org]}\n", nil)
	if err != nil || !slices.Equal(cfg.SelfUsage.PrefixModeExposes, []string{"project", "key", "org"}) {
		t.Fatalf("all three: %v %+v", err, cfg)
	}
	for _, c := range []struct{ yaml, want string }{
		{"self_usage: {per_address_per_minute: 0}", "self_usage.per_address_per_minute: must be at least 1"},
		{"self_usage: {per_key_per_minute: 0}", "self_usage.per_key_per_minute: must be at least 1"},
		{"self_usage: {prefix_mode_exposes: [ip]}", "self_usage.prefix_mode_exposes[0]: ip need not be listed: the caller's own address is always shown"},
		{"self_usage: {prefix_mode_exposes: [org, Org]}", `self_usage.prefix_mode_exposes[1]: "Org" is not key, org or project`},
		{"self_usage: {prefix_mode_exposes: [all]}", `self_usage.prefix_mode_exposes[0]: "all" is not key, org or project`},
		{"self_usage: {prefix_mode_exposes: [key, org, key]}", `self_usage.prefix_mode_exposes[2]: "key" is listed twice`},
		{"self_usage: {prefix_mode_exposes: org}", "self_usage.prefix_mode_exposes: "},
	} {
		_, err := parse(t, "upstream: {url: 'http://a'}\n"+c.yaml+"\n", nil)
		var ce *Error
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.yaml, err, c.want)
		}
	}
}
