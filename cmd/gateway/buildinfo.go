package main

import "runtime/debug"

// revision is the VCS revision the binary was built from, set at build time like version:
// -ldflags "-X main.revision=<commit>" (scripts/build.sh). Without it, the build info's
// vcs.revision is used (a plain go build in a checkout records it), else "unknown".
var revision = ""

// buildRevision is the revision gateway_build_info reports.
func buildRevision() string {
	if revision != "" {
		return revision
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var rev string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if modified {
		rev += "-dirty"
	}
	return rev
}
