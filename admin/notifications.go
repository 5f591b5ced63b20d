package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/notify"
)

// NotificationOutbox is the part of the webhook outbox the admin API reads and changes
// (notify.Memory and notify.Redis satisfy it, as any notify.Outbox does).
type NotificationOutbox interface {
	// List returns up to n deliveries: dead letters (dead) by when they died, or pending ones
	// by when they are due.
	List(ctx context.Context, dead bool, n int) ([]notify.Delivery, error)
	// Requeue makes a dead letter pending again, due at now; false if key is no dead letter.
	Requeue(ctx context.Context, key string, now time.Time) (bool, error)
	// Drop removes a delivery, pending or dead; false if there is none of that key.
	Drop(ctx context.Context, key string) (bool, error)
	// Count returns how many deliveries are pending and how many are dead.
	Count(ctx context.Context) (pending, dead int, err error)
}

// The /notifications endpoints (Handler registers the writes behind the write rules of
// protect.go):
//
//	GET  /notifications?state=dead|pending&n=100 -> {"pending", "dead", "deliveries": [...]}
//	POST /notifications/retry {"keys": [...]}     -> {"retried": [...], "missing": [...]}
//	POST /notifications/drop  {"keys": [...]}     -> {"dropped": [...], "missing": [...]}
//
// A delivery's key holds a "/" (event id, "/", endpoint name): the writes take keys in a
// JSON body, never in the path. A key that names no dead letter (retry) or no delivery
// (drop) is reported under "missing"; the others are acted on.
type notifications struct {
	box     NotificationOutbox
	timeout time.Duration
	log     *zap.Logger
	now     func() time.Time
}

// Bounds of the notification requests.
const (
	notificationsDefaultN = 100
	notificationsMaxN     = 1000
	// notificationsMaxKeys is how many keys one retry or drop takes.
	notificationsMaxKeys = 100
	// deliveryKeyMax bounds one key: an event id ("evt_" and 32 hex digits), "/" and an
	// endpoint name (at most 64 characters) fit with room to spare.
	deliveryKeyMax = 200
	// maxNotificationBody bounds a retry or drop body: notificationsMaxKeys keys of
	// deliveryKeyMax bytes, quoted.
	maxNotificationBody = 32 << 10
)

func newNotifications(o Options) notifications {
	timeout := o.UsageTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	return notifications{box: o.Notifications, timeout: timeout, log: o.Logger, now: time.Now}
}

// deliveryView is one delivery as the admin API shows it: what the outbox holds of it, the
// event's JSON included (data about a tenant's use; never the endpoint's URL or secret, which
// the outbox does not hold).
type deliveryView struct {
	Key       string          `json:"key"`
	ID        string          `json:"id"`
	Endpoint  string          `json:"endpoint"`
	Type      string          `json:"type"`
	Created   time.Time       `json:"created"`
	Attempts  int             `json:"attempts"`
	Next      time.Time       `json:"next"`
	LastError string          `json:"last_error"`
	Dead      bool            `json:"dead"`
	Body      json.RawMessage `json:"body"`
}

func viewOf(d notify.Delivery) deliveryView {
	body := d.Body
	if !json.Valid(body) {
		body = json.RawMessage("null") // never expected: the outbox stores what json.Marshal wrote
	}
	return deliveryView{Key: d.Key, ID: d.ID, Endpoint: d.Endpoint, Type: d.Type, Created: d.Created.UTC(),
		Attempts: d.Attempts, Next: d.Next.UTC(), LastError: d.LastError, Dead: d.Dead, Body: body}
}

type deliveryList struct {
	Pending    int            `json:"pending"`
	Dead       int            `json:"dead"`
	Deliveries []deliveryView `json:"deliveries"`
}

// oneParam is the single value of a query parameter, def when absent; false when given twice.
func oneParam(r *http.Request, name, def string) (string, bool) {
	vs, ok := r.URL.Query()[name]
	switch {
	case !ok:
		return def, true
	case len(vs) != 1:
		return "", false
	}
	return vs[0], true
}

func (nt notifications) list(w http.ResponseWriter, r *http.Request) {
	state, ok := oneParam(r, "state", "dead")
	if !ok || (state != "dead" && state != "pending") {
		writeFieldError(w, &fieldError{"state", `"dead" (the default) or "pending", once`})
		return
	}
	nText, ok := oneParam(r, "n", strconv.Itoa(notificationsDefaultN))
	n, err := strconv.Atoi(nText)
	if !ok || err != nil || n < 1 || n > notificationsMaxN {
		writeFieldError(w, &fieldError{"n", fmt.Sprintf("a whole number from 1 to %d (default %d)", notificationsMaxN, notificationsDefaultN)})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), nt.timeout)
	defer cancel()
	var out deliveryList
	out.Pending, out.Dead, err = nt.box.Count(ctx)
	var ds []notify.Delivery
	if err == nil {
		ds, err = nt.box.List(ctx, state == "dead", n)
	}
	if err != nil {
		nt.unavailable(w, "list", err)
		return
	}
	out.Deliveries = make([]deliveryView, 0, len(ds))
	for _, d := range ds {
		out.Deliveries = append(out.Deliveries, viewOf(d))
	}
	writeJSON(w, http.StatusOK, out)
}

func (nt notifications) unavailable(w http.ResponseWriter, what string, err error) {
	nt.log.Warn("notification outbox "+what+" failed", zap.Error(err))
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "outbox_unavailable", "The notification outbox is unavailable. Please retry in a moment.")
}

// keysRequest is the body of a retry or a drop.
type keysRequest struct {
	Keys []string `json:"keys"`
}

// readKeys decodes and checks a retry or drop body, and names its keys in the audit line;
// nil once it has answered. Repeated keys are acted on once.
func readKeys(w http.ResponseWriter, r *http.Request) []string {
	var req keysRequest
	fe := readJSONBody(w, r, &req, maxNotificationBody)
	if fe == nil {
		fe = checkKeys(req.Keys)
	}
	if fe != nil {
		writeFieldError(w, fe)
		return nil
	}
	seen := make(map[string]bool, len(req.Keys))
	keys := make([]string, 0, len(req.Keys))
	for _, k := range req.Keys {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	// Printable ASCII without spaces (checked): the keys read back unambiguously.
	setAuditTarget(r, strings.Join(keys, " "))
	return keys
}

func checkKeys(keys []string) *fieldError {
	switch {
	case len(keys) == 0:
		return &fieldError{"keys", fmt.Sprintf("required: 1 to %d delivery keys (\"<event id>/<endpoint>\", as GET /notifications lists them)", notificationsMaxKeys)}
	case len(keys) > notificationsMaxKeys:
		return &fieldError{"keys", fmt.Sprintf("at most %d keys in one request", notificationsMaxKeys)}
	}
	for i, k := range keys {
		if !validDeliveryKey(k) {
			return &fieldError{"keys", fmt.Sprintf("key %d is not a delivery key: want \"<event id>/<endpoint>\", printable ASCII without spaces, at most %d characters", i+1, deliveryKeyMax)}
		}
	}
	return nil
}

// validDeliveryKey: printable ASCII without spaces, at most deliveryKeyMax bytes, an event id
// and an endpoint name on either side of its last "/".
func validDeliveryKey(k string) bool {
	if len(k) > deliveryKeyMax {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] > '~' {
			return false
		}
	}
	i := strings.LastIndexByte(k, '/')
	return i > 0 && i < len(k)-1
}

// act runs one retry or drop over keys: those it acted on under done, the others under
// "missing". A store that fails midway answers 503: the keys already acted on stay so
// (listing the outbox shows where it stands; a retry or drop may be sent again).
func (nt notifications) act(w http.ResponseWriter, r *http.Request, done string, f func(context.Context, string) (bool, error)) {
	keys := readKeys(w, r)
	if keys == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), nt.timeout)
	defer cancel()
	acted, missing := []string{}, []string{}
	for _, k := range keys {
		ok, err := f(ctx, k)
		if err != nil {
			nt.unavailable(w, done, err)
			return
		}
		if ok {
			acted = append(acted, k)
		} else {
			missing = append(missing, k)
		}
	}
	writeJSON(w, http.StatusOK, map[string][]string{done: acted, "missing": missing})
}

// retry makes dead letters pending again, due now: each is retried for
// notifications.retry_for from now, its attempts counted anew.
func (nt notifications) retry(w http.ResponseWriter, r *http.Request) {
	nt.act(w, r, "retried", func(ctx context.Context, key string) (bool, error) {
		return nt.box.Requeue(ctx, key, nt.now())
	})
}

// drop removes deliveries, dead or pending: they are never sent.
func (nt notifications) drop(w http.ResponseWriter, r *http.Request) {
	nt.act(w, r, "dropped", nt.box.Drop)
}
