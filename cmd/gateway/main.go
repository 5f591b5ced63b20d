// Command gateway is the gateway's one binary: the server (the listeners, wired) and its CLI.
//
// Gateway is the API gateway in front of the documentation platform: it parses flags,
// loads the config, builds the logger, metrics and handler, runs the public and admin
// listeners and shuts down gracefully on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/proxy"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := runMain(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes: 0 clean shutdown, 1 runtime failure, 2 bad flags or config.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

type flags struct {
	config      string
	version     bool
	dev         bool
	checkConfig bool
	strict      bool
}

func parseFlags(args []string) (flags, error) {
	var f flags
	fs := newFlagSet("gateway")
	fs.StringVar(&f.config, "config", "", "path to the YAML config file (see config.example.yaml)")
	fs.BoolVar(&f.version, "version", false, "print the version and exit")
	fs.BoolVar(&f.dev, "dev", false, "readable console logs at debug level, for development")
	fs.BoolVar(&f.checkConfig, "check-config", false, "validate the config file, print every warning a start would log, and exit")
	fs.BoolVar(&f.strict, "strict", false, "with -check-config: exit 2 when there is a warning (for CI)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return f, err
		}
		return f, errors.New(flagMessage(err))
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unknown command or argument %q", printable(clipArg(fs.Arg(0))))
	}
	if !f.version && f.config == "" {
		return f, errors.New("-config FILE is required")
	}
	if f.strict && !f.checkConfig {
		return f, errors.New("-strict applies to -check-config only: a start logs its warnings and runs")
	}
	return f, nil
}

// run is main without the process: tests call it with their own context and writers.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, mainUsage)
		return exitOK
	}
	if err != nil {
		return usageError(stderr, "", "%v", err)
	}
	if f.version {
		printVersion(stdout)
		return exitOK
	}
	cfg, err := loadConfig(f.config)
	if err != nil {
		fmt.Fprintf(stderr, "gateway: %v\n", err)
		return exitUsage
	}
	if f.checkConfig {
		return checkConfig(f, cfg, stdout, stderr)
	}
	if err := serve(ctx, f.config, cfg, f.dev); err != nil {
		err = redacted(err, cfg)
		fmt.Fprintf(stderr, "gateway: %v\n", err)
		var ce configError
		if errors.As(err, &ce) {
			return exitUsage
		}
		return exitFailure
	}
	return exitOK
}

// checkConfig is -check-config: it refuses what a start would refuse before it touches Redis
// or the network (routes and limits compiled, the keys file read), prints on standard error
// every warning a start would log ("gateway: warning: ..."), and with -strict fails on them.
func checkConfig(f flags, cfg *config.Config, stdout, stderr io.Writer) int {
	m := metrics.New(prometheus.NewRegistry())
	eng := engine.New(engine.Options{Limiter: limits.NewMemory(), Metrics: m, Logger: zap.NewNop()})
	_, err := proxy.New(proxy.Options{Config: cfg, Logger: zap.NewNop(), Metrics: m, Engine: eng})
	if err == nil && keysFileOnly(cfg) {
		_, err = newRegistry(context.Background(), nil, cfg, zap.NewNop())
	}
	if err != nil {
		fmt.Fprintf(stderr, "gateway: %v\n", redacted(err, cfg))
		return exitUsage
	}
	warnings := startWarnings(cfg)
	for _, w := range warnings {
		fmt.Fprintf(stderr, "gateway: warning: %s\n", w)
	}
	switch {
	case len(warnings) == 0:
		fmt.Fprintf(stdout, "gateway: %s is valid\n", f.config)
	case f.strict:
		fmt.Fprintf(stderr, "gateway: %s is valid but has %s, and -strict fails on warnings\n", f.config, plural(len(warnings), "warning"))
		return exitUsage
	default:
		fmt.Fprintf(stdout, "gateway: %s is valid, with %s (above; -strict fails on them)\n", f.config, plural(len(warnings), "warning"))
	}
	return exitOK
}

// plural is "1 warning", "2 warnings".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
