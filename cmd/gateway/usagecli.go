package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"
)

const usageUsage = `Usage:
  gateway usage top     [-admin URL | -config FILE] [--limit NAME] [-n 20] [-json]
  gateway usage show    [-admin URL | -config FILE] (--org ORG | --project ID | --ip IP | --key-stdin) [-json]
  gateway usage history [-admin URL | -config FILE] --limit NAME --id ID [--unit requests|tokens] [-json]

Reads usage through a running gateway's admin API. The admin token is read from
GATEWAY_ADMIN_TOKEN (or the admin_token of -config), never from the command line.

  top      the N tenants nearest their limit (highest fraction first) in the current window,
           for every enabled limit or the one --limit names (N from 1 to 1000, default 20)
  show     one tenant's use of every limit that applies to it: an org, a project, a client IP,
           or an API key read from standard input (one line, never the command line; the
           gateway counts it by its digest)
  history  a tenant's use of one fixed-window limit in the windows the gateway keeps, newest
           first: the allowance in force now (limit, grants, override), the current window
           and each ended one the tenant was counted in (how many counted nothing is said);
           ID is what top shows (a project id, an org, an IP or a key's digest); --unit reads
           what the limit counted in another unit before a change of its unit

Tables by default; -json prints the admin API's JSON answer as it came:
  top       {"limits": [{"limit", "window", "unit", "tenants": [{"id", "org", "label", "plan",
            "used", "reserved", "limit", "remaining", "fraction", "reset", "granted",
            "override"}]}]}; with --limit, the one list object without "limits"
  show      {"limits": [{"name", "unit", "limit", "used", "reserved", "remaining", "reset",
            "granted", "override"}]}
  history   {"limit", "id", "unit", "windows": [{"start", "end", "used", "limit"}]}, every
            window kept; the current one (first) also has "allowance", "granted" and
            "override" in the limit's own unit

Flags:
` + adminFlagsUsage + `
Exit codes: 0 done; 1 the admin API refused or did not answer ("gateway: CODE: MESSAGE", the
API's error code, e.g. unknown_limit); 2 a usage or config error, found before any request.

Examples:
  export GATEWAY_ADMIN_TOKEN=...   # the gateway's admin_token
  gateway usage top -n 5
  gateway usage top -config /etc/gateway/config.yaml   # its admin_listen, TLS and admin_token
  gateway usage top --limit assistant_per_org -json
  gateway usage show --org acme
  gateway usage show --key-stdin < key.txt
  gateway usage history --limit agent_job_per_project --id p1
`

// usageArgs are the flags of one `gateway usage` command.
type usageArgs struct {
	adminFlags
	limit, id, org, project, ip string
	unit                        string
	n                           int
	keyStdin                    bool
}

// runUsage is the `gateway usage` subcommand.
func runUsage(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	sub, args, code, done := subcommand(args, "usage", []string{"top", "show", "history"}, stdout, stderr)
	if done {
		return code
	}
	var a usageArgs
	fs := newFlagSet("gateway usage " + sub)
	a.register(fs)
	switch sub {
	case "top":
		fs.StringVar(&a.limit, "limit", "", "only this limit (default: every enabled limit)")
		fs.IntVar(&a.n, "n", 20, "how many tenants per limit, 1 to 1000")
	case "show":
		fs.StringVar(&a.org, "org", "", "an organization")
		fs.StringVar(&a.project, "project", "", "a project id")
		fs.StringVar(&a.ip, "ip", "", "a client IP address")
		fs.BoolVar(&a.keyStdin, "key-stdin", false, "an API key, read from standard input")
	case "history":
		fs.StringVar(&a.limit, "limit", "", "the limit's name")
		fs.StringVar(&a.id, "id", "", "the tenant's id, as top shows it")
		fs.StringVar(&a.unit, "unit", "", "requests or tokens: the counters of that unit (default: the limit's own)")
	}
	positional, code, done := parseCommand(fs, args, "usage", stdout, stderr)
	if done {
		return code
	}
	if err := a.check(sub, positional); err != nil {
		return usageError(stderr, "usage", "usage %s: %v", sub, err)
	}
	c := adminRequest{method: http.MethodGet}
	switch sub {
	case "top":
		q := url.Values{"n": {strconv.Itoa(a.n)}}
		if a.limit != "" {
			q.Set("limit", a.limit)
		}
		c.path = "/usage/top?" + q.Encode()
	case "history":
		q := url.Values{"limit": {a.limit}, "id": {a.id}}
		if a.unit != "" {
			q.Set("unit", a.unit)
		}
		c.path = "/usage/history?" + q.Encode()
	case "show":
		switch {
		case a.org != "":
			c.path = "/usage/orgs/" + url.PathEscape(a.org)
		case a.project != "":
			c.path = "/usage/projects/" + url.PathEscape(a.project)
		case a.ip != "":
			c.path = "/usage/ips/" + url.PathEscape(a.ip)
		default:
			key, err := readKey(stdin, stderr)
			if err != nil {
				fmt.Fprintf(stderr, "gateway: %v\n", err)
				return exitFailure
			}
			c.method, c.path, c.body = http.MethodPost, "/usage/key", map[string]string{"key": key}
		}
	}
	return a.call(ctx, c, getenv, stdout, stderr, func(w io.Writer, data []byte) error {
		switch sub {
		case "top":
			return printTop(w, data, a.limit != "")
		case "history":
			return printHistory(w, data)
		}
		return printUsage(w, data)
	})
}

// check validates the command's arguments without the network.
func (a *usageArgs) check(sub string, positional []string) error {
	if len(positional) > 0 {
		// Never echo it: it may be a key given on the command line by mistake.
		return errors.New("unexpected argument (a key is read from standard input with --key-stdin, never from the command line)")
	}
	switch sub {
	case "top":
		if a.n < 1 || a.n > 1000 {
			return errors.New("-n must be from 1 to 1000")
		}
	case "history":
		if a.limit == "" || a.id == "" {
			return errors.New("--limit and --id are required")
		}
		if a.unit != "" && a.unit != "requests" && a.unit != "tokens" {
			return errors.New("--unit must be requests or tokens")
		}
	case "show":
		given := 0
		for _, set := range []bool{a.org != "", a.project != "", a.ip != "", a.keyStdin} {
			if set {
				given++
			}
		}
		if given != 1 {
			return errors.New("give one of --org, --project, --ip or --key-stdin")
		}
		if a.ip != "" {
			if _, err := netip.ParseAddr(a.ip); err != nil {
				return fmt.Errorf("--ip %q is not an IP address", printable(clipArg(a.ip)))
			}
		}
	}
	return a.adminFlags.check()
}

// The admin API's usage answers, as the CLI prints them (admin/admin.go, top.go, history.go).
type (
	usageOverride struct {
		Value   int64     `json:"value"`
		Expires time.Time `json:"expires"`
	}
	usageLimit struct {
		Name      string         `json:"name"`
		Unit      string         `json:"unit"`
		Limit     int64          `json:"limit"`
		Used      int64          `json:"used"`
		Reserved  *int64         `json:"reserved"`
		Remaining int64          `json:"remaining"`
		Reset     time.Time      `json:"reset"`
		Granted   int64          `json:"granted"`
		Override  *usageOverride `json:"override"`
	}
	topTenant struct {
		ID        string         `json:"id"`
		Label     string         `json:"label"`
		Org       string         `json:"org"`
		Used      int64          `json:"used"`
		Reserved  *int64         `json:"reserved"`
		Limit     int64          `json:"limit"`
		Remaining int64          `json:"remaining"`
		Fraction  float64        `json:"fraction"`
		Reset     time.Time      `json:"reset"`
		Plan      string         `json:"plan"`
		Granted   int64          `json:"granted"`
		Override  *usageOverride `json:"override"`
	}
	topList struct {
		Limit   string      `json:"limit"`
		Window  string      `json:"window"`
		Unit    string      `json:"unit"`
		Tenants []topTenant `json:"tenants"`
	}
	historyRow struct {
		Start     time.Time      `json:"start"`
		End       time.Time      `json:"end"`
		Used      int64          `json:"used"`
		Limit     int64          `json:"limit"`
		Allowance *int64         `json:"allowance"`
		Granted   int64          `json:"granted"`
		Override  *usageOverride `json:"override"`
	}
	historyAnswer struct {
		Limit   string       `json:"limit"`
		ID      string       `json:"id"`
		Unit    string       `json:"unit"`
		Windows []historyRow `json:"windows"`
	}
)

// quota says what of a tenant's limit comes from run-time quota: "+N" granted, an override.
func quota(granted int64, o *usageOverride) string {
	s := ""
	if o != nil {
		s = fmt.Sprintf("override %d until %s", o.Value, o.Expires.UTC().Format(time.RFC3339))
	}
	if granted > 0 {
		if s != "" {
			s += ", "
		}
		s += "+" + strconv.FormatInt(granted, 10) + " granted"
	}
	return dash(s)
}

// planName is a tenant's plan as the usage page names it: "default" for the default limits.
func planName(plan string) string {
	if plan == "" {
		return "default"
	}
	return printable(plan)
}

func reservedText(r *int64) string {
	if r == nil {
		return "-"
	}
	return strconv.FormatInt(*r, 10)
}

// percent shows a fraction of the limit; a use too small to round to 0.1% is "<0.1%", not 0.
func percent(f float64) string {
	if f > 0 && f < 0.001 {
		return "<0.1%"
	}
	return strconv.FormatFloat(f*100, 'f', 1, 64) + "%"
}

func printTop(w io.Writer, data []byte, one bool) error {
	var lists []topList
	if one {
		var l topList
		if err := json.Unmarshal(data, &l); err != nil {
			return err
		}
		lists = []topList{l}
	} else {
		var all struct{ Limits []topList }
		if err := json.Unmarshal(data, &all); err != nil {
			return err
		}
		lists = all.Limits
	}
	for i, l := range lists {
		if i > 0 {
			fmt.Fprintln(w)
		}
		// As the usage page says it: "requests per hour", or a streams limit's "streams in flight".
		if l.Window == "" {
			fmt.Fprintf(w, "%s (%s in flight)\n", printable(l.Limit), printable(l.Unit))
		} else {
			fmt.Fprintf(w, "%s (%s per %s)\n", printable(l.Limit), printable(l.Unit), printable(l.Window))
		}
		if len(l.Tenants) == 0 {
			if l.Window == "" {
				fmt.Fprintln(w, "  no answer in flight")
			} else {
				fmt.Fprintln(w, "  no use in the current window")
			}
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tORG\tPLAN\tUSED\tRESERVED\tLIMIT\tREMAINING\tUSE\tRESET\tQUOTA")
		for _, t := range l.Tenants {
			id := printable(t.ID)
			if t.Label != "" {
				id += " (" + printable(t.Label) + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\t%s\t%s\n", id, dash(printable(t.Org)), planName(t.Plan), t.Used,
				reservedText(t.Reserved), t.Limit, t.Remaining, percent(t.Fraction), t.Reset.UTC().Format(time.RFC3339), quota(t.Granted, t.Override))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func printUsage(w io.Writer, data []byte) error {
	var u struct{ Limits []usageLimit }
	if err := json.Unmarshal(data, &u); err != nil {
		return err
	}
	if len(u.Limits) == 0 {
		fmt.Fprintln(w, "no limit applies")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LIMIT\tUNIT\tUSED\tRESERVED\tLIMIT\tREMAINING\tRESET\tQUOTA")
	for _, l := range u.Limits {
		reserved := l.Reserved
		if l.Unit != "tokens" { // only tokens limits hold anything; the answer says 0 for the others
			reserved = nil
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\t%s\t%s\n", printable(l.Name), printable(l.Unit), l.Used, reservedText(reserved),
			l.Limit, l.Remaining, l.Reset.UTC().Format(time.RFC3339), quota(l.Granted, l.Override))
	}
	return tw.Flush()
}

// printHistory shows what the counters hold: the allowance in force now with its run-time
// quota, then the current window and the ended ones the tenant was counted in, and how many
// kept windows counted nothing. It never applies today's limit to an ended window: the
// limit may not have existed then, or been another.
func printHistory(w io.Writer, data []byte) error {
	var h historyAnswer
	if err := json.Unmarshal(data, &h); err != nil {
		return err
	}
	fmt.Fprintf(w, "%s %s (%s)\n", printable(h.Limit), printable(h.ID), printable(h.Unit))
	if len(h.Windows) == 0 {
		fmt.Fprintln(w, "no window kept")
		return nil
	}
	if cur := h.Windows[0]; cur.Allowance != nil {
		fmt.Fprintf(w, "allowance now: %d (limit %d", *cur.Allowance, cur.Limit)
		if q := quota(cur.Granted, cur.Override); q != "-" {
			fmt.Fprintf(w, ", %s", q)
		}
		fmt.Fprintln(w, ")")
	} else {
		fmt.Fprintf(w, "no limit counts %s now: these are the counters of the limit's former unit\n", printable(h.Unit))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "START\tEND\tUSED\t")
	empty := 0
	for i, win := range h.Windows {
		if i > 0 && win.Used == 0 {
			empty++
			continue
		}
		note := ""
		if i == 0 {
			note = "current"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", win.Start.UTC().Format(time.RFC3339), win.End.UTC().Format(time.RFC3339), win.Used, note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch ended := len(h.Windows) - 1; {
	case ended > 0 && empty == ended:
		fmt.Fprintf(w, "nothing counted in the %d ended windows kept\n", ended)
	case empty > 0:
		fmt.Fprintf(w, "nothing counted in the other %d of the %d ended windows kept\n", empty, ended)
	}
	return nil
}
