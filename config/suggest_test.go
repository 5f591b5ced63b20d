package config

import "testing"

func TestSuggest(t *testing.T) {
	known := []string{"agent_job_per_project", "assistant_per_key", "assistant_per_org", "assistant_per_ip"}
	for _, c := range []struct{ name, want string }{
		{"agent_jobs_per_project", " (did you mean agent_job_per_project?)"},
		{"assistant_per_ogr", " (did you mean assistant_per_org?)"}, // a swap is one edit
		{"Assistant_Per_Key", " (did you mean assistant_per_key?)"},
		{"assistant_per_org", ""}, // itself: nothing to suggest
		{"tokens_per_org", ""},    // nothing close
		{"assistant_tokens_per_ip", ""},
	} {
		if got := Suggest(c.name, known); got != c.want {
			t.Errorf("Suggest(%q) = %q, want %q", c.name, got, c.want)
		}
	}
	if got := Suggest("timout", []string{"url", "timeout", "dial_timeout"}); got != " (did you mean timeout?)" {
		t.Errorf("timout: %q", got)
	}
	if got := Suggest("x", nil); got != "" {
		t.Errorf("no candidates: %q", got)
	}
}
