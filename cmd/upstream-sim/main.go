// Command upstream-sim stands in for the documentation platform's API, for demos, tests and benchmarks.
//
// Upstream-sim is a stand-in for the documentation platform's HTTP
// API (agent jobs and the documentation assistant), for demos, tests and
// benchmarks of the gateway that sits in front of it.
//
// It keeps everything in memory, speaks only the subset of the API the
// gateway proxies, and is tuned to be fast and silent unless asked otherwise.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Defaults for the flags; -fast overrides the streaming ones unless they are
// given explicitly.
const (
	defaultListen           = "127.0.0.1:9000"
	defaultJobCompleteAfter = 5 * time.Second
	defaultPartDelay        = 50 * time.Millisecond
	defaultAnswerParts      = 8
	fastAnswerParts         = 2
	shutdownGrace           = 5 * time.Second
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run parses args, serves until SIGINT/SIGTERM and returns the exit code.
func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("upstream-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", defaultListen, "address to listen on (host:port; port 0 picks a free port)")
	completeAfter := fs.Duration("job-complete-after", defaultJobCompleteAfter, "a job reads status \"active\" until this long after creation (or after its last follow-up message), then \"completed\" with a prLink")
	partDelay := fs.Duration("part-delay", defaultPartDelay, "pause before each streamed text part of an assistant answer; 0 = no pacing")
	answerParts := fs.Int("answer-parts", defaultAnswerParts, "`count` of text parts (v1 0: lines, v2 text-delta events) in an assistant answer")
	fast := fs.Bool("fast", false, fmt.Sprintf("load-test mode: no pacing and %d text parts (explicit -part-delay / -answer-parts still win)", fastAnswerParts))
	stamp := fs.Bool("stamp", false, "prefix the text of every text part (v1 0:, v2 text-delta) with its send time in Unix nanoseconds and a space (\"<unix-nanos> words...\"), so a client can measure per-part delay")
	logReq := fs.Bool("log", false, "log one line per request to stderr (off by default)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `upstream-sim: in-memory stand-in for the documentation platform API.

Endpoints:
  POST /v2/agent/{projectId}/job                   create a job (Bearer svc_... required) -> 201
  GET  /v2/agent/{projectId}/job/{jobId}           poll a job -> 200 / 404
  POST /v2/agent/{projectId}/job/{jobId}/message   follow-up prompt -> 200 / 404
  POST /discovery/v1/assistant/{domain}/message    streamed answer, data stream protocol (AI SDK 4; Bearer svc_dsc_... required)
  POST /discovery/v2/assistant/{domain}/message    the same answer as a UI message stream (AI SDK 5+; SSE, usage
                                                   and threadId in the finish chunk's messageMetadata)
  GET  /healthz                                    "ok"

Usage: upstream-sim [flags]

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "upstream-sim: unexpected arguments: %q\n", fs.Args())
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *fast {
		if !set["part-delay"] {
			*partDelay = 0
		}
		if !set["answer-parts"] {
			*answerParts = fastAnswerParts
		}
	}
	switch {
	case *completeAfter < 0:
		fmt.Fprintln(stderr, "upstream-sim: -job-complete-after must not be negative")
		return 2
	case *partDelay < 0:
		fmt.Fprintln(stderr, "upstream-sim: -part-delay must not be negative")
		return 2
	case *answerParts < 0:
		fmt.Fprintln(stderr, "upstream-sim: -answer-parts must not be negative")
		return 2
	}

	cfg := simConfig{
		JobCompleteAfter: *completeAfter,
		PartDelay:        *partDelay,
		AnswerParts:      *answerParts,
		Stamp:            *stamp,
	}
	if *logReq {
		cfg.Log = stderr
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "upstream-sim: %v\n", err)
		return 1
	}
	srv := newServer(newHandler(cfg))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	fmt.Fprintf(stderr, "upstream-sim: listening on %s (job-complete-after=%s part-delay=%s answer-parts=%d stamp=%t)\n",
		ln.Addr(), cfg.JobCompleteAfter, cfg.PartDelay, cfg.AnswerParts, cfg.Stamp)

	select {
	case err := <-serveErr:
		fmt.Fprintf(stderr, "upstream-sim: serve: %v\n", err)
		return 1
	case <-ctx.Done():
	}
	stop() // a second signal now kills the process the default way

	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Streams still running after the grace period are cut off.
		fmt.Fprintf(stderr, "upstream-sim: shutdown: %v; closing remaining connections\n", err)
		_ = srv.Close()
	}
	<-serveErr // http.ErrServerClosed
	fmt.Fprintln(stderr, "upstream-sim: stopped")
	return 0
}

// newServer wraps h in an http.Server with timeouts suitable for a local
// simulator. There is no WriteTimeout: answers are streams whose length
// depends on -part-delay and -answer-parts.
func newServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
}
