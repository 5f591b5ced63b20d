package config

import (
	"errors"
	"strings"
	"testing"
)

// cutoff: on a tokens limit with a reserve, enforced, and per plan like the other fields;
// anywhere else a config error that names the key.
func TestCutoff(t *testing.T) {
	const base = "upstream: {url: 'http://a'}\n"
	const tok = "limits: {tok: {limit: 1000, window: hour, by: org, unit: tokens, reserve: 100%s}}\n"
	c, err := parse(t, base+strings.Replace(tok, "%s", ", cutoff: true", 1)+
		"plans: {free: {tok: {cutoff: false}}, gold: {tok: {limit: 5000}}}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	cutoff := func(plan string) bool {
		for _, s := range c.PlanLimits(plan) {
			if s.Name == "tok" {
				return s.Cutoff
			}
		}
		t.Fatalf("no tok in plan %q", plan)
		return false
	}
	if !cutoff("") || cutoff("free") || !cutoff("gold") {
		t.Fatalf("cutoff by plan: default %v, free %v, gold %v", cutoff(""), cutoff("free"), cutoff("gold"))
	}
	for _, s := range c.ResolvedLimits() {
		if s.Name != "tok" && s.Cutoff {
			t.Fatalf("%s has cutoff without setting it", s.Name)
		}
	}

	cases := []struct{ yaml, want string }{
		{"limits: {assistant_per_org: {cutoff: true}}\n",
			"limits.assistant_per_org.cutoff: only a tokens limit ends an answer in flight (assistant_per_org counts requests)"},
		{"limits: {s: {limit: 5, by: org, unit: streams, cutoff: true}}\n",
			"limits.s.cutoff: only a tokens limit ends an answer in flight (s counts streams)"},
		{"limits: {t: {limit: 1000, window: hour, by: org, unit: tokens, cutoff: true}}\n",
			"limits.t.cutoff: needs a reserve"},
		{"limits: {t: {limit: 1000, window: hour, by: org, unit: tokens, reserve: 10, mode: shadow, cutoff: true}}\n",
			"limits.t.cutoff: a shadow limit never ends an answer"},
		{strings.Replace(tok, "%s", "", 1) + "plans: {gold: {assistant_per_key: {cutoff: true}}}\n",
			"plans.gold.assistant_per_key.cutoff: only a tokens limit ends an answer in flight"},
		{strings.Replace(tok, "%s", ", cutoff: true", 1) + "plans: {gold: {tok: {mode: shadow}}}\n",
			"plans.gold.tok.cutoff: a shadow limit never ends an answer"},
		{strings.Replace(tok, "%s", ", cutoff: true", 1) + "plans: {gold: {tok: {reserve: 0}}}\n",
			"plans.gold.tok.cutoff: needs a reserve"},
		{"limits: {assistant_per_org: {cutoff: yes please}}\n", "limits.assistant_per_org.cutoff: cannot use"},
	}
	for _, tc := range cases {
		_, err := parse(t, base+tc.yaml, nil)
		var ce *Error
		if !errors.As(err, &ce) {
			t.Errorf("%q: error %v is not a config error", tc.yaml, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
			t.Errorf("%q:\n got %q\nwant a single line containing %q", tc.yaml, msg, tc.want)
		}
	}
}
