package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/internal/netguard"
)

// Event is what an endpoint receives, as the JSON body {"type", "id", "time", "data"}.
type Event struct {
	Type string    `json:"type"`
	ID   string    `json:"id"`
	Time time.Time `json:"time"`
	Data any       `json:"data"`
	// Once (with a StableID) makes the outbox take the event only if it has not taken it in
	// the last SeenFor: for events that every replica detects (an override's end, a
	// revocation), so that one delivered already is not delivered again.
	Once bool `json:"-"`
	// Share is whose the event is: the limit it is about ("" for none), which also chooses
	// the endpoints that take it (Endpoint.Limits), and whether that limit counts visitors.
	Share Share `json:"-"`
}

// Endpoint is one webhook: where events go, the keys that sign them, and which it takes.
type Endpoint struct {
	Name string
	URL  string
	Keys [][]byte
	// Events and Limits filter what the endpoint receives; nil takes all. An event of no
	// limit (key.revoked) passes any Limits filter.
	Events []string
	Limits []string
	// AllowPrivate lets deliveries connect to loopback, link-local, private and metadata
	// addresses (config: allow_private_addresses); off, such a connection is refused after
	// DNS, whatever the URL names (netguard).
	AllowPrivate bool
}

func (e *Endpoint) takes(typ, limit string) bool {
	return (e.Events == nil || slices.Contains(e.Events, typ)) &&
		(e.Limits == nil || limit == "" || slices.Contains(e.Limits, limit))
}

// Results of a delivery, as reported to Options.OnResult (the metric's result label).
const (
	ResultDelivered = "delivered" // answered 2xx
	ResultFailed    = "failed"    // an attempt failed; retried later
	ResultDead      = "dead"      // retried for retry_for, or the endpoint answered 410: a dead letter
	ResultDropped   = "dropped"   // never sent: the outbox (or a queue to it) was full (Share's rule)
)

// Options tune a Notifier; zero values take the defaults noted.
type Options struct {
	// Timeout bounds one attempt (default 5s); MaxBackoff caps the wait between attempts
	// (default 5m); RetryFor is how long a delivery is retried before it is dead (default 24h).
	Timeout, MaxBackoff, RetryFor time.Duration
	// Concurrency bounds the attempts in flight (default 8).
	Concurrency int
	// Poll is how often the outbox is asked for due deliveries (default 1s); an event
	// published here is attempted at once.
	Poll time.Duration
	// Lease is how long a claimed delivery is withheld from other replicas (default
	// 2×Timeout+5s): a replica that dies mid-delivery leaves it to another after that.
	Lease time.Duration
	// Client sends every endpoint's requests; nil: NewClient's, one for the endpoints that
	// allow private addresses and one for the others.
	Client *http.Client
	// Now and Jitter (in [0, 1)) are the clock and the randomness of backoffs.
	Now    func() time.Time
	Jitter func() float64
	// OnResult, when set, is told of every attempt's outcome and of every drop.
	OnResult func(d Delivery, result string, latency time.Duration)
	Log      *zap.Logger
}

// Notifier publishes events into an outbox and delivers what is due from it.
type Notifier struct {
	box       Outbox
	endpoints map[string]*Endpoint
	order     []*Endpoint
	o         Options
	wake      chan struct{}
	// guarded and open send the deliveries of endpoints without and with AllowPrivate: a
	// connection one opened is never reused by the other's.
	guarded, open *http.Client
}

// New returns a Notifier over box for endpoints.
func New(box Outbox, endpoints []Endpoint, o Options) *Notifier {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 5 * time.Minute
	}
	if o.RetryFor <= 0 {
		o.RetryFor = 24 * time.Hour
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	if o.Lease <= 0 {
		o.Lease = 2*o.Timeout + 5*time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Jitter == nil {
		o.Jitter = rand.Float64
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	n := &Notifier{box: box, endpoints: map[string]*Endpoint{}, o: o, wake: make(chan struct{}, 1),
		guarded: o.Client, open: o.Client}
	if o.Client == nil {
		n.guarded, n.open = NewClient(false), NewClient(true)
	}
	for i := range endpoints {
		e := &endpoints[i]
		n.endpoints[e.Name] = e
		n.order = append(n.order, e)
	}
	return n
}

// NewClient returns the HTTP client deliveries use. It follows no redirect (a 3xx is a
// failed attempt: the operator updates the URL), and connects directly, never through
// HTTP_PROXY or HTTPS_PROXY: the address checked is the endpoint's own. Unless allowPrivate,
// it refuses to connect to loopback, link-local, private and metadata addresses
// (netguard.Control), checked after DNS for every address a name resolves to.
func NewClient(allowPrivate bool) *http.Client {
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		dialer.Control = netguard.Control
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = dialer.DialContext
	return &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// client is the client that sends e's deliveries.
func (n *Notifier) client(e *Endpoint) *http.Client {
	if e.AllowPrivate {
		return n.open
	}
	return n.guarded
}

// Publish writes evs, each bound for every endpoint that takes its type and limit (its
// Share's), into the outbox in one write, and wakes the delivery loop. The events are durable
// in the outbox's sense once Publish returns nil. What the outbox dropped to take them, or
// refused (Outbox), is returned and reported to Options.OnResult as ResultDropped.
func (n *Notifier) Publish(ctx context.Context, evs ...Event) (dropped []Delivery, err error) {
	now := n.o.Now()
	var ds []Delivery
	for _, ev := range evs {
		if ev.ID == "" {
			ev.ID = NewID()
		}
		if ev.Time.IsZero() {
			ev.Time = now
		}
		ev.Time = ev.Time.UTC()
		body, err := json.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("notify: encoding %s: %w", ev.Type, err)
		}
		for _, e := range n.order {
			if e.takes(ev.Type, ev.Share.Limit) {
				ds = append(ds, Delivery{Key: DeliveryKey(ev.ID, e.Name), ID: ev.ID, Endpoint: e.Name, Type: ev.Type, Body: body,
					Created: now, Next: now, Once: ev.Once, Limit: ev.Share.Limit, Visitor: ev.Share.Visitor})
			}
		}
	}
	if len(ds) == 0 {
		return nil, nil
	}
	dropped, err = n.box.Add(ctx, ds)
	if err != nil {
		return nil, err
	}
	for _, d := range dropped {
		n.report(d, ResultDropped, 0)
	}
	select {
	case n.wake <- struct{}{}:
	default:
	}
	return dropped, nil
}

func (n *Notifier) report(d Delivery, result string, latency time.Duration) {
	if n.o.OnResult != nil {
		n.o.OnResult(d, result, latency)
	}
}

// Run delivers due deliveries until ctx ends, at most Concurrency at once, then waits for
// the attempts in flight.
func (n *Notifier) Run(ctx context.Context) {
	slots := make(chan struct{}, n.o.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(n.o.Poll)
	defer t.Stop()
	for {
		if free := cap(slots) - len(slots); free > 0 {
			ds, err := n.box.Claim(ctx, n.o.Now(), free, n.o.Lease)
			if err != nil && ctx.Err() == nil {
				n.o.Log.Warn("notifications: claiming from the outbox failed", zap.Error(err))
			}
			for _, d := range ds {
				slots <- struct{}{}
				wg.Add(1)
				go func() {
					defer func() { <-slots; wg.Done() }()
					n.deliver(context.WithoutCancel(ctx), d)
				}()
			}
			if len(ds) == free {
				// Possibly more due: claim again once a slot frees.
				select {
				case <-ctx.Done():
					return
				case slots <- struct{}{}:
					<-slots
				}
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.wake:
		}
	}
}

// Attempt is one attempt's outcome.
type Attempt struct {
	Status     int           // 0: no answer
	Body       []byte        // up to 4 KiB of the answer, never logged
	Err        error         // transport error, without the URL
	RetryAfter time.Duration // from a Retry-After in seconds
	Latency    time.Duration
}

// OK tells whether the endpoint accepted the delivery (2xx).
func (a Attempt) OK() bool { return a.Err == nil && a.Status >= 200 && a.Status < 300 }

func (a Attempt) describe() string {
	if a.Err != nil {
		return a.Err.Error()
	}
	return "answered " + strconv.Itoa(a.Status)
}

// Send makes one signed attempt of body (an event's JSON, whose id is id) to e.
func (n *Notifier) Send(ctx context.Context, e *Endpoint, id string, body []byte) Attempt {
	ctx, cancel := context.WithTimeout(ctx, n.o.Timeout)
	defer cancel()
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL, bytes.NewReader(body))
	if err != nil {
		return Attempt{Err: errors.New("the endpoint's URL is not usable")}
	}
	ts := n.o.Now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "docsgate-gateway")
	req.Header.Set(HeaderID, id)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, Sign(e.Keys, id, ts, body))
	resp, err := n.client(e).Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL may carry a token in its query: never in a log line
		}
		var refused *netguard.RefusedError
		if errors.As(err, &refused) {
			err = fmt.Errorf("%w: deliveries to loopback, link-local, private and metadata addresses need allow_private_addresses: true on the endpoint", refused)
		}
		if ctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("no answer within %s", n.o.Timeout)
		}
		return Attempt{Err: err, Latency: time.Since(start)}
	}
	defer resp.Body.Close()
	a := Attempt{Status: resp.StatusCode}
	a.Body, _ = io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // let the connection be reused
	a.Latency = time.Since(start)
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		a.RetryAfter = time.Duration(s) * time.Second
	}
	return a
}

// errUnknownEndpoint is the attempt of a delivery to an endpoint this replica's config lacks.
var errUnknownEndpoint = errors.New("the endpoint is not configured on this replica")

// Endpoint returns the endpoint named name, or nil.
func (n *Notifier) Endpoint(name string) *Endpoint { return n.endpoints[name] }

func (n *Notifier) deliver(ctx context.Context, d Delivery) {
	var a Attempt
	if e := n.endpoints[d.Endpoint]; e != nil {
		a = n.Send(ctx, e, d.ID, d.Body)
	} else {
		// Not configured here: during a rolling deploy another replica may know it, so the
		// delivery waits its turn like a failed attempt, and is dead only after retry_for.
		a.Err = errUnknownEndpoint
	}
	if a.OK() {
		n.settle(ctx, d, ResultDelivered, a.Latency)
		return
	}
	d.Attempts++
	d.LastError = a.describe()
	now := n.o.Now()
	deadline := d.Created.Add(n.o.RetryFor)
	log := n.o.Log.With(zap.String("endpoint", d.Endpoint), zap.String("type", d.Type), zap.String("id", d.ID), zap.Int("attempts", d.Attempts), zap.String("error", d.LastError))
	switch {
	case a.Status == http.StatusGone:
		log.Warn("notification endpoint answered 410 Gone: kept as a dead letter")
		n.settle(ctx, d, ResultDead, a.Latency)
	case !now.Before(deadline):
		log.Warn("notification not delivered within notifications.retry_for: kept as a dead letter")
		n.settle(ctx, d, ResultDead, a.Latency)
	default:
		wait := n.Backoff(d.Attempts, a.RetryAfter)
		d.Next = now.Add(wait)
		if d.Next.After(deadline) {
			d.Next = deadline
		}
		log.Info("notification attempt failed: retrying", zap.Duration("wait", wait))
		n.settle(ctx, d, ResultFailed, a.Latency)
	}
}

// Backoff is the wait after the attempts-th failed attempt: 1 s doubled per attempt, with
// jitter (between half and all of it), capped at MaxBackoff; a Retry-After answer waits at
// least that long (within MaxBackoff).
func (n *Notifier) Backoff(attempts int, retryAfter time.Duration) time.Duration {
	base := n.o.MaxBackoff
	if attempts <= 30 { // 2^29 s is years: beyond, any max_backoff is smaller (and the shift would overflow)
		if b := time.Second << (attempts - 1); b < base {
			base = b
		}
	}
	wait := base/2 + time.Duration(n.o.Jitter()*float64(base/2))
	if retryAfter > wait {
		wait = min(retryAfter, n.o.MaxBackoff)
	}
	return wait
}

func (n *Notifier) settle(ctx context.Context, d Delivery, result string, latency time.Duration) {
	var held bool
	var err error
	switch result {
	case ResultDelivered:
		held, err = n.box.Done(ctx, d)
	case ResultFailed:
		held, err = n.box.Retry(ctx, d)
	default:
		held, err = n.box.Kill(ctx, d, n.o.Now())
	}
	if err != nil {
		// The lease runs out and the delivery is attempted again: at least once.
		n.o.Log.Warn("notifications: recording an attempt in the outbox failed", zap.String("id", d.ID), zap.Error(err))
	} else if !held {
		n.o.Log.Info("notifications: a claim ran out before its attempt ended; another replica has it", zap.String("id", d.ID))
	}
	n.report(d, result, latency)
}
