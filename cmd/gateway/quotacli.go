package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/docsgate/gateway/internal/freetext"
)

const quotaUsage = `Usage:
  gateway quota grant    [-admin URL | -config FILE] --limit NAME --id ID --amount N --reason TEXT
  gateway quota override [-admin URL | -config FILE] --limit NAME --id ID --value N (--ttl 1h | --expires TIME) --reason TEXT
  gateway quota end      [-admin URL | -config FILE] --limit NAME --id ID --reason TEXT
  gateway quota reset    [-admin URL | -config FILE] --limit NAME --id ID --reason TEXT
  gateway quota audit    [-admin URL | -config FILE] [-n 100]
  gateway quota overrides [-admin URL | -config FILE]

Changes one tenant's quota of one limit at run time, through a running gateway's admin API
(every replica applies it at its next decision; with Redis it survives restarts), and reads
the audit trail every change leaves. The admin token is read from GATEWAY_ADMIN_TOKEN (or the
admin_token of -config), never from the command line. ID is what /usage/top shows: a project id, an org, an IP (or IPv6
prefix) or a key's digest.

  grant     adds N to the tenant's allowance for the current window only (grants add up);
            a streams limit has no window and takes no grant: use override
  override  makes N the tenant's limit instead of its plan's until it expires (0 refuses
            every request); --ttl is a duration (90m, 1h, 72h), --expires an RFC 3339 time,
            at most a year ahead
  end       ends the tenant's override early
  reset     makes the tenant's use of the current window 0 (a GCRA bucket full)
  audit     the newest N actions, newest first
  overrides every override in force

Flags:
` + adminFlagsUsage + `
Exit codes: 0 done; 1 the admin API refused or did not answer ("gateway: CODE: MESSAGE", the
API's error code); 2 a usage or config error, found before any request (bad flag, --ttl that is
not a duration, --expires that is not an RFC 3339 time, a missing or too long --reason, a
-config file that is not valid).

Examples:
  export GATEWAY_ADMIN_TOKEN=...   # the gateway's admin_token
  gateway quota audit -config /etc/gateway/config.yaml   # its admin_listen, TLS and admin_token
  gateway quota grant -admin http://10.0.0.5:9090 --limit agent_job_per_project --id p1 --amount 5000 --reason "ticket 4711: launch week"
  gateway quota override --limit assistant_per_org --id acme --value 10 --ttl 8h --reason "incident 93: abusive traffic"
  gateway quota override --limit assistant_per_ip --id 2001:db8:1:2::/64 --value 0 --expires 2027-01-01T00:00:00Z --reason "scraper"
  gateway quota end --limit assistant_per_org --id acme --reason "incident 93 resolved"
  gateway quota reset --limit assistant_per_key --id 3a68eb4a... --reason "client bug burned the quota"
  gateway quota audit -n 20
`

// quotaArgs are the flags of one `gateway quota` command.
type quotaArgs struct {
	adminFlags
	limit, id, reason, ttl, until string
	amount, value, n              int64
}

// runQuota is the `gateway quota` subcommand.
func runQuota(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	sub, args, code, done := subcommand(args, "quota", []string{"grant", "override", "end", "reset", "audit", "overrides"}, stdout, stderr)
	if done {
		return code
	}
	var a quotaArgs
	fs := newFlagSet("gateway quota " + sub)
	a.register(fs)
	a.flags(fs, sub)
	positional, code, done := parseCommand(fs, args, "quota", stdout, stderr)
	if done {
		return code
	}
	if err := a.check(sub, positional); err != nil {
		return usageError(stderr, "quota", "quota %s: %v", sub, err)
	}
	method, path, body := a.request(sub)
	return a.call(ctx, adminRequest{method, path, body}, getenv, stdout, stderr, func(w io.Writer, data []byte) error {
		return printQuota(w, sub, data)
	})
}

// flags declares the flags of the command sub.
func (a *quotaArgs) flags(fs *flag.FlagSet, sub string) {
	tenant := sub != "audit" && sub != "overrides"
	if tenant {
		fs.StringVar(&a.limit, "limit", "", "the limit's name")
		fs.StringVar(&a.id, "id", "", "the tenant's id, as /usage/top shows it")
		fs.StringVar(&a.reason, "reason", "", "why (1 to 500 characters; kept in the audit trail)")
	}
	switch sub {
	case "grant":
		fs.Int64Var(&a.amount, "amount", 0, "units to add for the current window")
	case "override":
		fs.Int64Var(&a.value, "value", -1, "the tenant's limit while the override lasts (0 refuses every request)")
		fs.StringVar(&a.ttl, "ttl", "", "how long it lasts (90m, 1h, 72h)")
		fs.StringVar(&a.until, "expires", "", "when it ends (RFC 3339)")
	case "audit":
		fs.Int64Var(&a.n, "n", 100, "how many entries, newest first")
	}
}

// Bounds the admin API enforces, checked here first so that a typo exits 2 before any
// request (admin/quota.go has the same numbers).
const quotaReasonMax = 500 // characters

// check validates the command's arguments without the network.
func (a *quotaArgs) check(sub string, positional []string) error {
	tenant := sub != "audit" && sub != "overrides"
	switch {
	case len(positional) > 0:
		return fmt.Errorf("unexpected argument %q", printable(clipArg(positional[0])))
	case tenant && (a.limit == "" || a.id == "" || a.reason == ""):
		return errors.New("--limit, --id and --reason are required")
	case tenant && strings.TrimSpace(a.reason) == "":
		return errors.New("--reason must say why: 1 to 500 characters, not only spaces")
	case tenant && utf8.RuneCountInString(a.reason) > quotaReasonMax:
		return fmt.Errorf("--reason: at most %d characters", quotaReasonMax)
	case sub == "grant" && a.amount < 1:
		return errors.New("--amount must be 1 or more")
	case sub == "override" && a.value < 0:
		return errors.New("--value is required (0 or more)")
	case sub == "override" && (a.ttl == "") == (a.until == ""):
		return errors.New("give --ttl or --expires (one of them)")
	case sub == "audit" && a.n < 1:
		return errors.New("-n must be 1 or more")
	}
	now := time.Now()
	latest := now.AddDate(1, 0, 0) // an override lasts at most a year
	if sub == "override" && a.ttl != "" {
		d, err := time.ParseDuration(a.ttl)
		switch {
		case err != nil:
			return fmt.Errorf("--ttl %q: want a duration such as 30m, 1h or 72h", printable(clipArg(a.ttl)))
		case d < time.Second:
			return errors.New("--ttl: at least 1s")
		case now.Add(d).After(latest):
			return errors.New("--ttl: at most a year")
		}
	}
	if sub == "override" && a.until != "" {
		t, err := time.Parse(time.RFC3339, a.until)
		switch {
		case err != nil:
			return fmt.Errorf("--expires %q: want an RFC 3339 time such as 2027-01-02T15:04:05Z", printable(clipArg(a.until)))
		case !t.After(now):
			return errors.New("--expires must be in the future")
		case t.After(latest):
			return errors.New("--expires: at most a year ahead")
		}
	}
	return a.adminFlags.check()
}

// request is the admin API call of the command.
func (a *quotaArgs) request(sub string) (method, path string, body any) {
	tenantPath := "/quota/overrides/" + url.PathEscape(a.limit) + "/" + url.PathEscape(a.id)
	switch sub {
	case "grant":
		return http.MethodPost, "/quota/grants", map[string]any{"limit": a.limit, "id": a.id, "amount": a.amount, "reason": a.reason}
	case "override":
		b := map[string]any{"limit": a.value, "reason": a.reason}
		if a.ttl != "" {
			b["ttl"] = a.ttl
		} else {
			b["expires"] = a.until
		}
		return http.MethodPut, tenantPath, b
	case "end":
		return http.MethodDelete, tenantPath, map[string]any{"reason": a.reason}
	case "reset":
		return http.MethodPost, "/quota/resets", map[string]any{"limit": a.limit, "id": a.id, "reason": a.reason}
	case "audit":
		return http.MethodGet, "/quota/audit?n=" + strconv.FormatInt(a.n, 10), nil
	}
	return http.MethodGet, "/quota/overrides", nil
}

// quotaState and auditEntry are the admin API's JSON, as the CLI prints it.
type quotaState struct {
	Limit   int64 `json:"limit"`
	Used    int64 `json:"used"`
	Granted int64 `json:"granted"`
}

func (s quotaState) String() string {
	return fmt.Sprintf("limit %d, used %d, granted %d", s.Limit, s.Used, s.Granted)
}

// short is "used/limit", with "+granted" when there are grants.
func (s quotaState) short() string {
	if s.Granted > 0 {
		return fmt.Sprintf("%d/%d (+%d)", s.Used, s.Limit, s.Granted)
	}
	return fmt.Sprintf("%d/%d", s.Used, s.Limit)
}

// printable keeps what the terminal shows to characters that print as themselves: no escape
// sequence, bidi override (U+202E) or line separator from an answer reaches it, whatever an
// older gateway stored (freetext.Clean).
func printable(s string) string {
	return freetext.Clean(s)
}

type auditEntry struct {
	Time   time.Time  `json:"time"`
	Actor  string     `json:"actor"`
	Action string     `json:"action"`
	Limit  string     `json:"limit"`
	ID     string     `json:"id"`
	Before quotaState `json:"before"`
	After  quotaState `json:"after"`
	Reason string     `json:"reason"`
}

type override struct {
	Limit   string    `json:"limit"`
	ID      string    `json:"id"`
	Value   int64     `json:"value"`
	Expires time.Time `json:"expires"`
	Reason  string    `json:"reason"`
	Actor   string    `json:"actor"`
	Created time.Time `json:"created"`
}

// printQuota says what the answer means, one line per action, a table for lists.
func printQuota(w io.Writer, sub string, data []byte) error {
	switch sub {
	case "grant":
		var g struct {
			Limit, ID string
			Granted   int64
			WindowEnd time.Time `json:"window_end"`
		}
		if err := json.Unmarshal(data, &g); err != nil {
			return err
		}
		fmt.Fprintf(w, "granted: %s %s now has %d granted for this window (until %s)\n", printable(g.Limit), printable(g.ID), g.Granted, g.WindowEnd.Format(time.RFC3339))
	case "override":
		var o override
		if err := json.Unmarshal(data, &o); err != nil {
			return err
		}
		fmt.Fprintf(w, "override: %s %s has a limit of %d until %s\n", printable(o.Limit), printable(o.ID), o.Value, o.Expires.Format(time.RFC3339))
	case "end", "reset":
		var e auditEntry
		if err := json.Unmarshal(data, &e); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s: %s %s: before %s; after %s\n", printable(e.Action), printable(e.Limit), printable(e.ID), e.Before, e.After)
	case "audit":
		var a struct{ Entries []auditEntry }
		if err := json.Unmarshal(data, &a); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TIME\tACTOR\tACTION\tLIMIT\tID\tBEFORE (used/limit)\tAFTER\tREASON")
		for _, e := range a.Entries {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Time.Format(time.RFC3339), printable(e.Actor), printable(e.Action),
				printable(e.Limit), printable(e.ID), e.Before.short(), e.After.short(), printable(e.Reason))
		}
		return tw.Flush()
	default:
		var l struct{ Overrides []override }
		if err := json.Unmarshal(data, &l); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "LIMIT\tID\tVALUE\tEXPIRES\tACTOR\tREASON")
		for _, o := range l.Overrides {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", printable(o.Limit), printable(o.ID), o.Value, o.Expires.Format(time.RFC3339), printable(o.Actor), printable(o.Reason))
		}
		return tw.Flush()
	}
	return nil
}
