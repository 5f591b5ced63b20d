package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
)

// keysTimeout bounds one `gateway keys` command against its store.
const keysTimeout = 15 * time.Second

const keysUsage = `Usage:
  gateway keys generate --kind admin|assistant
  gateway keys generate --kind admin|assistant --add -config FILE --org ORG (--project P ... | --domain D ...) [--plan NAME] [--label TEXT] [--scope ROUTE ...] [--expires WHEN]
  gateway keys add      -config FILE --kind admin|assistant --org ORG (--project P ... | --domain D ...) [--plan NAME] [--label TEXT] [--scope ROUTE ...] [--expires WHEN]  < key
  gateway keys rotate   -config FILE DIGEST [--overlap 24h] [--expires WHEN]
  gateway keys rotate   -config FILE --key-stdin [--overlap 24h] [--expires WHEN]  < key
  gateway keys revoke   -config FILE DIGEST
  gateway keys revoke   -config FILE --key-stdin  < key
  gateway keys list     -config FILE [-json]

generate prints a new key (its prefix and 32 characters from crypto/rand) on standard output;
with --add it also registers the key's digest as add does (the digest goes to standard error).
add reads the key from standard input (one line), never from the command line, stores only its
SHA-256 digest and prints that digest; a key needs at least 24 characters from [A-Za-z0-9_-]
after its prefix. Keys are stored in the config's Redis (redis.addrs) or, without Redis, in
auth.keys_file (the running gateway re-reads it on reload; writers take turns on a lock file
beside it, <keys_file>.lock).

--scope names a route the key may call (repeatable; default: every route of its kind); a
request to another route gets 403 out_of_scope. --expires is when the key stops working (401
key_expired after it): a lifetime from now (90d, 36h), a date (2027-01-01, midnight UTC) or an
RFC 3339 time, within auth.key_lifetime.<kind>.max; without it a new key gets
auth.key_lifetime.<kind>.default (none by default).

rotate issues the successor of a registered key: a new key with the same org, projects or
domains, plan, label and scopes, printed once on standard output (its digest on standard
error), and schedules the old key's end after --overlap (default 24h; 0s ends it now). Both
keys work during the overlap and are one tenant for every limit that counts by key: a
rotation never resets or splits a key's budget, and history and exports show the keys under
the first key's digest. A revoked, expired or already rotated key is refused. It needs
auth.mode: registry (in prefix mode the gateway knows no keys).

revoke takes the key's DIGEST (as list shows it) or, with --key-stdin, the key itself on
standard input (one line, never on the command line): the digest of a leaked key is then
computed for you. list prints a table; with -json one JSON object per line, a registry entry:
{"digest", "kind", "org", "projects" | "domains", "plan", "label", "scopes", "created",
"revoked", "expires", "lineage", "replaces", "rotated_to", "last_used"} (last_used: to the
minute, written by each replica once a minute).

Exit codes: 0 done; 1 refused at run time (a bad key on standard input, an unknown digest,
the store does not answer); 2 a usage or config error, found before the store is touched.

Examples:
  gateway keys generate --kind assistant --add -config gateway.yaml --org acme --domain acme-docs > key.txt
  gateway keys add -config gateway.yaml --kind admin --org acme --project p1 < key.txt
  gateway keys revoke -config gateway.yaml 3a68eb4a...
  gateway keys rotate -config gateway.yaml --key-stdin --overlap 1h < leaked-key.txt > new-key.txt
  gateway keys revoke -config gateway.yaml --key-stdin < leaked-key.txt
  gateway keys list -config gateway.yaml -json
`

// runKeys is the `gateway keys` subcommand: add, revoke and list registered keys.
func runKeys(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	sub, args, code, done := subcommand(args, "keys", []string{"generate", "add", "rotate", "revoke", "list"}, stdout, stderr)
	if done {
		return code
	}
	if sub == "rotate" {
		return runKeysRotate(ctx, args, stdin, stdout, stderr)
	}

	fs := newFlagSet("gateway keys " + sub)
	configPath := fs.String("config", "", "path to the gateway's YAML config file")
	var (
		kind, org, plan, label string
		expires                string
		projects, domains      listFlag
		scopes                 listFlag
		asJSON, register       bool
		keyStdin               bool
	)
	switch sub {
	case "generate":
		fs.BoolVar(&register, "add", false, "also register the new key's digest (needs -config and the add flags)")
		fallthrough
	case "add":
		fs.StringVar(&kind, "kind", "", "key family: admin or assistant")
		fs.StringVar(&org, "org", "", "organization the key belongs to")
		fs.Var(&projects, "project", "project an admin key may be used on (repeatable; * for any)")
		fs.Var(&domains, "domain", "domain an assistant key may be used on (repeatable; * for any)")
		fs.StringVar(&plan, "plan", "", "plan of the key (optional)")
		fs.StringVar(&label, "label", "", "a note for operators (optional)")
		fs.StringVar(&expires, "expires", "", "when the key stops working: a lifetime (90d, 36h), a date or an RFC 3339 time; default: the kind's default lifetime")
		fs.Var(&scopes, "scope", "a route the key may call (repeatable; default: every route of its kind)")
	case "list":
		fs.BoolVar(&asJSON, "json", false, "one JSON object per line instead of a table")
	case "revoke":
		fs.BoolVar(&keyStdin, "key-stdin", false, "read the key to revoke from standard input instead of giving its DIGEST")
	}
	positional, code, done := parseCommand(fs, args, "keys", stdout, stderr)
	if done {
		return code
	}
	usage := func(format string, a ...any) int {
		return usageError(stderr, "keys", "keys %s: %s", sub, fmt.Sprintf(format, a...))
	}
	if sub == "generate" && !register {
		if len(positional) != 0 {
			return usage("unexpected argument")
		}
		k, ok := auth.ParseKind(kind)
		if !ok {
			return usage("--kind must be admin or assistant")
		}
		if org != "" || len(projects) > 0 || len(domains) > 0 || plan != "" || label != "" || expires != "" || len(scopes) > 0 || *configPath != "" {
			return usage("--org, --project, --domain, --plan, --label, --expires, --scope and -config register the key: add --add")
		}
		key, err := auth.Generate(k)
		if err != nil {
			fmt.Fprintf(stderr, "gateway keys generate: %v\n", err)
			return exitFailure
		}
		fmt.Fprintln(stdout, key)
		return exitOK
	}
	if *configPath == "" {
		return usage("-config FILE is required")
	}
	want := 0
	if sub == "revoke" && !keyStdin {
		want = 1
	}
	if len(positional) != want {
		if sub == "revoke" && keyStdin {
			// Never echo it: with --key-stdin an argument is most likely the key itself.
			return usage("with --key-stdin the key is read from standard input and no argument is taken (never the key)")
		}
		if sub == "revoke" {
			return usage("want exactly one DIGEST (from gateway keys list)")
		}
		// Never echo it: it may be a key given on the command line by mistake.
		return usage("unexpected argument; the key is read from standard input, never from the command line")
	}

	// Everything that can be checked before the key is read is checked first.
	var entry auth.Entry
	if sub == "add" || sub == "generate" {
		k, ok := auth.ParseKind(kind)
		if !ok {
			return usage("--kind must be admin or assistant")
		}
		entry = auth.Entry{Kind: k.String(), Org: org, Projects: projects, Domains: domains, Plan: plan, Label: label,
			Scopes: scopes, Digest: strings.Repeat("0", 64)} // placeholder until the key is read
		err := entry.Validate()
		if err == nil {
			err = entry.CheckText()
		}
		if err != nil {
			return usage("%v", err)
		}
	}
	if sub == "revoke" && !keyStdin && !auth.ValidDigest(positional[0]) {
		return usage("not a digest: want 64 lower-case hex characters (gateway keys list shows them)")
	}

	cfg, err := config.Load(*configPath, os.LookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "gateway keys: %v\n", err)
		return exitUsage
	}
	if _, ok := cfg.Plans[entry.Plan]; entry.Plan != "" && !ok {
		return usage("--plan %q is not defined under plans in %s", entry.Plan, *configPath)
	}
	if sc, ok := unknownScope(cfg, &entry); !ok {
		return usage("--scope %q is not the name of a route of %s keys in %s", printable(clipArg(sc)), entry.Kind, *configPath)
	}
	var asked *time.Time
	if expires != "" {
		t, err := parseExpires(expires, time.Now())
		if err != nil {
			return usage("--expires: %v", err)
		}
		asked = &t
	}
	ctx, cancel := context.WithTimeout(ctx, keysTimeout)
	defer cancel()

	fail := func(err error) int {
		fmt.Fprintf(stderr, "gateway keys %s: %v\n", sub, err)
		return exitFailure
	}
	switch sub {
	case "add", "generate":
		var key string
		if sub == "generate" {
			key, err = auth.Generate(mustKind(entry.Kind))
		} else {
			key, err = readKey(stdin, stderr)
		}
		if err != nil {
			return fail(err)
		}
		id, reason := auth.Check("Bearer "+key, mustKind(entry.Kind))
		if reason != 0 {
			return fail(keyRefusal(reason, entry.Kind))
		}
		if err := auth.CheckStrength(key, mustKind(entry.Kind)); err != nil {
			return fail(fmt.Errorf("the key on standard input: %w", err))
		}
		entry.Digest = id.Digest
		err = withStore(ctx, cfg, func(s keyStore) error {
			if err := setExpiry(ctx, s, &entry, asked, keyLifetimes(cfg)); err != nil {
				return err
			}
			return s.Add(ctx, entry)
		})
		if err != nil {
			return fail(err)
		}
		if sub == "generate" {
			// The key goes to standard output alone, so `> key.txt` captures exactly it.
			fmt.Fprintln(stdout, key)
			fmt.Fprintf(stderr, "gateway keys generate: registered digest %s\n", entry.Digest)
		} else {
			fmt.Fprintln(stdout, entry.Digest)
		}
		reloadHint(stderr, cfg)
	case "revoke":
		var digest string
		if keyStdin {
			if digest, err = digestFromStdin(stdin, stderr); err != nil {
				return fail(err)
			}
		} else {
			digest = positional[0]
		}
		err := withStore(ctx, cfg, func(s keyStore) error { return s.Revoke(ctx, digest) })
		if errors.Is(err, auth.ErrUnknownKey) {
			if keyStdin {
				return fail(fmt.Errorf("the key on standard input is not registered (its digest is %s)", digest))
			}
			return fail(errors.New("no key with this digest is registered"))
		}
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "revoked %s\n", digest)
		reloadHint(stderr, cfg)
	case "list":
		var list []auth.Entry
		err := withStore(ctx, cfg, func(s keyStore) error {
			var err error
			list, err = s.List(ctx)
			return err
		})
		if err != nil {
			return fail(err)
		}
		if !asJSON && len(list) == 0 {
			// A header alone reads like a failure: say where nothing was found.
			fmt.Fprintf(stdout, "no keys are registered in %s\n", keyStoreName(cfg))
			return exitOK
		}
		uses, err := loadLastUse(ctx, cfg)
		if err != nil {
			return fail(err)
		}
		if err := printKeys(stdout, auth.WithLastUse(list, uses), asJSON); err != nil {
			return fail(err)
		}
	}
	return exitOK
}

// reloadHint says how a keys-file change reaches running gateways; with Redis it reaches
// them by itself.
func reloadHint(stderr io.Writer, cfg *config.Config) {
	if len(cfg.Redis.Addrs) == 0 {
		fmt.Fprintf(stderr, "gateway keys: %s updated; running gateways read it on SIGHUP or POST /reload\n", cfg.Auth.KeysFile)
	}
}

// keyStoreName says where `gateway keys` keeps the keys of cfg.
func keyStoreName(cfg *config.Config) string {
	if len(cfg.Redis.Addrs) > 0 {
		return "Redis (redis.addrs " + strings.Join(cfg.Redis.Addrs, ",") + ")"
	}
	return "auth.keys_file " + cfg.Auth.KeysFile
}

func mustKind(s string) auth.Kind {
	k, _ := auth.ParseKind(s)
	return k
}

// keyRefusal explains why a key from stdin was refused, without repeating it.
func keyRefusal(r auth.Reason, kind string) error {
	switch r {
	case auth.Malformed:
		return fmt.Errorf("the key on standard input is malformed (empty, over %d bytes, or characters outside the bearer token set)", auth.MaxKeyLen)
	case auth.UnknownFamily:
		return errors.New("the key on standard input is of neither key family (svc_... admin, svc_dsc_... assistant)")
	case auth.WrongKind:
		return fmt.Errorf("the key on standard input is not an %s key: it belongs to the other family", kind)
	}
	return errors.New("the key on standard input was refused")
}

// digestFromStdin reads a key of either family from stdin and returns its digest: the key
// itself goes no further.
func digestFromStdin(stdin io.Reader, stderr io.Writer) (string, error) {
	key, err := readKey(stdin, stderr)
	if err != nil {
		return "", err
	}
	id, reason := auth.Check("Bearer "+key, auth.Admin)
	if reason == auth.WrongKind {
		id, reason = auth.Check("Bearer "+key, auth.Assistant)
	}
	if reason != 0 {
		return "", keyRefusal(reason, "")
	}
	return id.Digest, nil
}

// readKey reads one line from stdin (trimmed). On a terminal it prompts on stderr first.
func readKey(stdin io.Reader, stderr io.Writer) (string, error) {
	if isTerminal(stdin) {
		fmt.Fprint(stderr, "Key (one line, then Enter): ")
	}
	const limit = 4096
	line, err := bufio.NewReaderSize(io.LimitReader(stdin, limit), limit).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("reading the key from standard input: %w", err)
	}
	if len(line) >= limit && !strings.HasSuffix(line, "\n") {
		return "", errors.New("the line on standard input is too long to be a key")
	}
	key := strings.TrimSpace(line)
	if key == "" {
		return "", errors.New("no key on standard input: pipe it in, e.g. gateway keys add ... < keyfile")
	}
	return key, nil
}

// keyStore is where `gateway keys` keeps entries.
type keyStore interface {
	Add(ctx context.Context, e auth.Entry) error
	Revoke(ctx context.Context, digest string) error
	Rotate(ctx context.Context, old string, next auth.Entry, oldEnds time.Time) (auth.Entry, error)
	Lookup(ctx context.Context, digest string) (auth.Entry, bool, error)
	List(ctx context.Context) ([]auth.Entry, error)
}

// withStore runs f on the config's store: Redis when redis.addrs is set, else the keys file
// (loaded, changed, and written back atomically when f succeeds).
func withStore(ctx context.Context, cfg *config.Config, f func(keyStore) error) error {
	if len(cfg.Redis.Addrs) > 0 {
		client := newKeysRedisClient(cfg.Redis)
		defer client.Close()
		// Fail fast, with one clear line, when Redis does not answer.
		if err := client.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis %s does not answer: %w", strings.Join(cfg.Redis.Addrs, ","), err)
		}
		reg, err := auth.NewRedisRegistry(ctx, client, auth.RedisRegistryOptions{
			Prefix:   cfg.Redis.KeyPrefix,
			CacheTTL: cfg.Auth.CacheTTL,
		})
		if err != nil {
			return err
		}
		defer reg.Close()
		return f(reg)
	}
	path := cfg.Auth.KeysFile
	if path == "" {
		return errors.New("nowhere to keep keys: the config sets neither redis.addrs nor auth.keys_file")
	}
	// One writer at a time across processes: the CLI and a running gateway's POST/DELETE
	// /keys both read, change and rewrite this file.
	unlock, err := auth.LockKeysFile(ctx, path)
	if err != nil {
		return err
	}
	defer unlock()
	entries, err := auth.LoadKeysFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		entries, err = nil, nil // the first add creates it
	}
	if err != nil {
		return err
	}
	reg, err := auth.NewMemoryRegistry(entries)
	if err != nil {
		return fmt.Errorf("keys file %s: %w", path, err)
	}
	before, _ := reg.List(ctx)
	if err := f(reg); err != nil {
		return err
	}
	after, _ := reg.List(ctx)
	if entriesEqual(before, after) {
		return nil // list, or nothing changed: leave the file alone
	}
	return auth.SaveKeysFile(path, after)
}

func entriesEqual(a, b []auth.Entry) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// newKeysRedisClient builds a client for the config's Redis (standalone, Sentinel or Cluster)
// like the limiter does, with timeouts for an operator command rather than the request path;
// admin writes are idempotent, so go-redis may retry them.
func newKeysRedisClient(c config.Redis) redis.UniversalClient {
	timeout := max(c.Timeout, 2*time.Second)
	opts := &redis.UniversalOptions{
		Addrs:                 c.Addrs,
		MasterName:            c.MasterName,
		Username:              c.Username,
		Password:              c.Password,
		DB:                    c.DB,
		ContextTimeoutEnabled: true,
		DialTimeout:           timeout,
		ReadTimeout:           timeout,
		WriteTimeout:          timeout,
		PoolTimeout:           timeout,
	}
	if c.TLS {
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	// go-redis would print each failed dial on stderr; the command reports the error itself.
	// (The logger is process-wide; this process runs only this command.)
	redis.SetLogger(quietRedisLogger{})
	return redis.NewUniversalClient(opts)
}

type quietRedisLogger struct{}

func (quietRedisLogger) Printf(context.Context, string, ...any) {}

func printKeys(w io.Writer, list []auth.Entry, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, e := range list {
			if err := enc.Encode(e); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "DIGEST\tKIND\tORG\tGRANTS\tSCOPES\tPLAN\tLABEL\tCREATED\tREVOKED\tEXPIRES\tLAST USED")
	for _, e := range list {
		grants := "projects=" + strings.Join(e.Projects, ",")
		if e.Kind == "assistant" {
			grants = "domains=" + strings.Join(e.Domains, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Digest, e.Kind, dash(printable(e.Org)), printable(grants),
			dash(printable(strings.Join(e.Scopes, ","))), dash(printable(e.Plan)), dash(printable(e.Label)),
			e.Created.UTC().Format(time.RFC3339), timeOrDash(e.Revoked), timeOrDash(e.Expires), timeOrDash(e.LastUsed))
	}
	return tw.Flush()
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// parseInterspersed parses flags anywhere among the arguments (revoke -config F DIGEST and
// revoke DIGEST -config F both work) and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil // after --, everything is positional
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// listFlag is a repeatable string flag; commas separate several values too.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}
