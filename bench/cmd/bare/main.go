// Command bare is the benchmark's reference point: the least a proxy of the gateway's design
// can do per request. It is an httputil.ReverseProxy with a pooled copy buffer that makes one
// Redis script call (EVALSHA of a small INCR+EXPIRE script, like a one-limit fixed window) per
// request and nothing else: no auth, no validation, no metrics, no logs. It lives in bench/,
// never in the product.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// incr is a one-key fixed window: count, and set the expiry on the window's first hit.
var incr = redis.NewScript(`
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return n`)

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *(b.p.Get().(*[]byte)) }
func (b *bufferPool) Put(v []byte) { b.p.Put(&v) }

func main() {
	listen := flag.String("listen", "127.0.0.1:8081", "address to listen on")
	upstream := flag.String("upstream", "http://127.0.0.1:9000", "upstream URL")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "standalone Redis address")
	pprofAddr := flag.String("pprof", "", "address of a /debug/pprof/ listener, for profiling bare like the gateway (none when empty)")
	flag.Parse()
	if *pprofAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		go func() { _ = http.ListenAndServe(*pprofAddr, mux) }()
	}

	u, err := url.Parse(*upstream)
	if err != nil {
		log.Fatalf("bare: upstream: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, MaxRetries: -1})
	defer rdb.Close()

	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	rp.BufferPool = &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}
	rp.ErrorLog = log.New(io.Discard, "", 0)
	// Like the gateway: every write flushed on the streamed assistant path, the default
	// (answers of unknown length flushed at once) elsewhere.
	stream := *rp
	stream.FlushInterval = -1

	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 100*time.Millisecond)
		err := incr.Run(ctx, rdb, []string{"bare:{project}"}, 3600).Err()
		cancel()
		if err != nil {
			http.Error(w, `{"error":"limiter unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/discovery/") {
			stream.ServeHTTP(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	})

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("bare: %v", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		_ = srv.Close()
	}()
	fmt.Fprintf(os.Stderr, "bare: listening on %s -> %s (redis %s)\n", ln.Addr(), u, *redisAddr)
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		log.Fatalf("bare: %v", err)
	}
}
