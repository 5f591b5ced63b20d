package main

import (
	"strings"

	"github.com/docsgate/gateway/config"
)

// selfUsageExposure is the warning for what the tenants' usage endpoint shows to anyone in
// prefix mode, where any made-up key of the right family passes; "" when it shows only the
// caller's own address (the default), in registry mode, or when the endpoint is off.
func selfUsageExposure(cfg *config.Config) string {
	su := cfg.SelfUsage
	if !su.Enabled || cfg.Auth.Mode == "registry" || len(su.PrefixModeExposes) == 0 {
		return ""
	}
	var what []string
	plans := false // limits by key or org take the named domain's plan
	for _, e := range su.PrefixModeExposes {
		switch e {
		case "key":
			what = append(what, "the counters of any key it sends (assistant keys are public: the pages that use them embed them)")
			plans = true
		case "org":
			what = append(what, "any org's counters, by naming one of its domains (which also tells which domains share an org)")
			plans = true
		case "project":
			what = append(what, "any project's counters, by naming it")
		}
	}
	if plans {
		what = append(what, "and in those limits' values the plan of the named domain's org")
	}
	return "self_usage.prefix_mode_exposes is set while auth.mode is prefix, where the gateway cannot tell a real key from a made-up one: " +
		su.Path + " shows anyone " + strings.Join(what, "; ") +
		". Remove it to show callers only their own address's counters, or use auth.mode registry."
}
