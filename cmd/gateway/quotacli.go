package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/docsgate/gateway/internal/freetext"
)

// quotaTimeout bounds one `gateway quota` call to the admin API.
const quotaTimeout = 15 * time.Second

const quotaUsage = `Usage:
  gateway quota grant    [-admin URL] --limit NAME --id ID --amount N --reason TEXT
  gateway quota override [-admin URL] --limit NAME --id ID --value N (--ttl 1h | --expires TIME) --reason TEXT
  gateway quota end      [-admin URL] --limit NAME --id ID --reason TEXT
  gateway quota reset    [-admin URL] --limit NAME --id ID --reason TEXT
  gateway quota audit    [-admin URL] [-n 100]
  gateway quota overrides [-admin URL]

Changes one tenant's quota of one limit at run time, through a running gateway's admin API
(every replica applies it at its next decision; with Redis it survives restarts), and reads
the audit trail every change leaves. The admin token is read from GATEWAY_ADMIN_TOKEN, never
from the command line. ID is what /usage/top shows: a project id, an org, an IP (or IPv6
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
  -admin URL   the admin listener (default http://127.0.0.1:9090, or GATEWAY_ADMIN_URL)
  -cacert FILE trust this CA for an https admin URL (PEM)
  -json        print the admin API's JSON answer

Examples:
  export GATEWAY_ADMIN_TOKEN=...   # the gateway's admin_token
  gateway quota grant -admin http://10.0.0.5:9090 --limit agent_job_per_project --id p1 --amount 5000 --reason "ticket 4711: launch week"
  gateway quota override --limit assistant_per_org --id acme --value 10 --ttl 8h --reason "incident 93: abusive traffic"
  gateway quota override --limit assistant_per_ip --id 2001:db8:1:2::/64 --value 0 --expires 2027-01-01T00:00:00Z --reason "scraper"
  gateway quota end --limit assistant_per_org --id acme --reason "incident 93 resolved"
  gateway quota reset --limit assistant_per_key --id 3a68eb4a... --reason "client bug burned the quota"
  gateway quota audit -n 20
`

// quotaArgs are the flags of one `gateway quota` command.
type quotaArgs struct {
	admin, cacert                 string
	limit, id, reason, ttl, until string
	amount, value, n              int64
	asJSON                        bool
}

// runQuota is the `gateway quota` subcommand.
func runQuota(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, quotaUsage)
		return exitUsage
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, quotaUsage)
		return exitOK
	case "grant", "override", "end", "reset", "audit", "overrides":
	default:
		fmt.Fprintf(stderr, "gateway quota: unknown command %q\n%s", sub, quotaUsage)
		return exitUsage
	}
	a, err := parseQuotaArgs(sub, args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		if err.Error() != "" {
			fmt.Fprintf(stderr, "gateway quota %s: %v\n", sub, err)
		}
		return exitUsage
	}
	client, err := adminHTTPClient(a.cacert)
	if err != nil {
		fmt.Fprintf(stderr, "gateway quota %s: %v\n", sub, err)
		return exitUsage
	}
	method, path, body := a.request(sub)
	ctx, cancel := context.WithTimeout(ctx, quotaTimeout)
	defer cancel()
	status, data, err := callAdmin(ctx, client, method, strings.TrimSuffix(a.admin, "/")+path, getenv("GATEWAY_ADMIN_TOKEN"), body)
	if err != nil {
		fmt.Fprintf(stderr, "gateway quota %s: %v\n", sub, err)
		return exitFailure
	}
	if status >= 300 {
		var e struct{ Error, Code string }
		if json.Unmarshal(data, &e) != nil || e.Code == "" {
			e.Error, e.Code = strings.TrimSpace(string(data)), strconv.Itoa(status)
		}
		fmt.Fprintf(stderr, "gateway quota %s: %s (%d %s)\n", sub, printable(e.Error), status, printable(e.Code))
		return exitFailure
	}
	if a.asJSON {
		_, _ = stdout.Write(data)
		return exitOK
	}
	if err := printQuota(stdout, sub, data); err != nil {
		fmt.Fprintf(stderr, "gateway quota %s: reading the answer: %v\n", sub, err)
		return exitFailure
	}
	return exitOK
}

func parseQuotaArgs(sub string, args []string, getenv func(string) string, stderr io.Writer) (quotaArgs, error) {
	var a quotaArgs
	fs := flag.NewFlagSet("gateway quota "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, quotaUsage) }
	a.admin = getenv("GATEWAY_ADMIN_URL")
	if a.admin == "" {
		a.admin = "http://127.0.0.1:9090"
	}
	fs.StringVar(&a.admin, "admin", a.admin, "the admin listener's URL")
	fs.StringVar(&a.cacert, "cacert", "", "CA certificate (PEM) for an https admin URL")
	fs.BoolVar(&a.asJSON, "json", false, "print the JSON answer")
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
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return a, err
		}
		return a, errors.New("") // the flag package has said why
	}
	switch {
	case len(positional) > 0:
		return a, fmt.Errorf("unexpected argument %q", positional[0])
	case tenant && (a.limit == "" || a.id == "" || a.reason == ""):
		return a, errors.New("--limit, --id and --reason are required")
	case sub == "grant" && a.amount < 1:
		return a, errors.New("--amount must be 1 or more")
	case sub == "override" && a.value < 0:
		return a, errors.New("--value is required (0 or more)")
	case sub == "override" && (a.ttl == "") == (a.until == ""):
		return a, errors.New("give --ttl or --expires (one of them)")
	}
	if u, err := url.Parse(a.admin); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return a, fmt.Errorf("-admin %q: want http://host:port or https://host:port", a.admin)
	}
	return a, nil
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

func adminHTTPClient(cacert string) (*http.Client, error) {
	if cacert == "" {
		return &http.Client{}, nil
	}
	pem, err := os.ReadFile(cacert)
	if err != nil {
		return nil, fmt.Errorf("-cacert: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("-cacert %s: no PEM certificate", cacert)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}}}, nil
}

// callAdmin sends one admin API request with the token (when set) and returns the answer.
func callAdmin(ctx context.Context, client *http.Client, method, target, token string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	return res.StatusCode, data, err
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
