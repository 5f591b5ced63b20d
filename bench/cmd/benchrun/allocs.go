package main

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// allocSplit is where the allocations of one agent_job request come from, read from a memory
// profile of BenchmarkGatewayAgentJob taken with every allocation sampled
// (-memprofilerate 1), as `go tool pprof -sample_index=alloc_objects -traces` prints it.
type allocSplit struct {
	own, lib float64 // per request
	sites    []allocSite
}

type allocSite struct {
	fn    string // the allocating function (runtime frames are not in the profile)
	own   bool
	perOp float64
}

// gatewayPkg prefixes the functions of the gateway's own code.
const gatewayPkg = "github.com/docsgate/gateway/"

// frameworks are the library code that calls the gateway, or that the gateway hands a request
// to: what they allocate on their own is theirs, not the gateway's.
var frameworks = []string{"net/http/httputil.(*ReverseProxy).", "net/http.(*ServeMux).", "net/http.(*conn).", "net/http.(*Transport)."}

// ownAlloc reports whether an allocation (its stack, allocating function first) is the
// gateway's own: made in the gateway's packages, or by a library function the gateway's code
// calls (context.WithValue, hex.EncodeToString, ProxyRequest.SetXForwarded, ...), with no
// framework between; and the index of that nearest gateway frame.
func ownAlloc(frames []string) (bool, int) {
	for i, fn := range frames {
		if strings.HasPrefix(fn, gatewayPkg) {
			return true, i
		}
		for _, fw := range frameworks {
			if strings.HasPrefix(fn, fw) {
				return false, 0
			}
		}
	}
	return false, 0
}

// readAllocTraces counts the allocations made while serving requests (stacks through
// proxy.(*Gateway).ServeHTTP; setup is left out) per request, n requests in all, split into
// the gateway's own (see ownAlloc) and the rest: net/http's and httputil.ReverseProxy's own
// work.
func readAllocTraces(path string, n int) (allocSplit, error) {
	f, err := os.Open(path)
	if err != nil {
		return allocSplit{}, err
	}
	defer f.Close()
	var (
		split  allocSplit
		count  int64
		frames []string
		bySite = map[string]*allocSite{}
	)
	flush := func() {
		defer func() { count, frames = 0, frames[:0] }()
		if count == 0 || len(frames) == 0 || !slices.ContainsFunc(frames, func(s string) bool {
			return s == gatewayPkg+"proxy.(*Gateway).ServeHTTP"
		}) {
			return
		}
		own, caller := ownAlloc(frames)
		key := frames[0]
		if own && caller > 0 {
			key += " (from " + strings.TrimPrefix(frames[caller], gatewayPkg) + ")"
		}
		s := bySite[key]
		if s == nil {
			s = &allocSite{fn: key, own: own}
			bySite[key] = s
		}
		per := float64(count) / float64(n)
		s.perOp += per
		if own {
			split.own += per
		} else {
			split.lib += per
		}
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "-----------+"):
			flush()
		case strings.HasPrefix(line, "bytes:"), line == "":
		default:
			fields := strings.Fields(line)
			if len(frames) == 0 && count == 0 {
				if c, err := strconv.ParseInt(fields[0], 10, 64); err == nil && len(fields) > 1 {
					count = c
					fields = fields[1:]
				}
			}
			if count > 0 || len(frames) > 0 {
				frames = append(frames, fields[0]) // "(inline)" is a field of its own
			}
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		return allocSplit{}, fmt.Errorf("%s: %w", path, err)
	}
	for _, s := range bySite {
		if s.perOp >= 0.01 {
			split.sites = append(split.sites, *s)
		}
	}
	slices.SortFunc(split.sites, func(a, b allocSite) int {
		if a.own != b.own {
			if a.own {
				return -1
			}
			return 1
		}
		return strings.Compare(a.fn, b.fn)
	})
	return split, nil
}
