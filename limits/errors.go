package limits

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrorKind is what a failed limiter call says about Redis. It is the kind label of
// gateway_ratelimit_decision_errors_total, and it decides whether a failure moves the breaker: only a
// failing node does (MovesBreaker).
type ErrorKind string

const (
	// KindData: Redis answered, with an error about the data of a key (a key of another type
	// someone wrote under a limit's name: WRONGTYPE). The node is healthy; only the requests
	// counted under that key fail.
	KindData ErrorKind = "data"
	// KindNode: the node cannot serve anyone now: a refused or broken connection, LOADING,
	// READONLY, CLUSTERDOWN, MASTERDOWN, BUSY, OOM, too few replicas acknowledging, ...
	KindNode ErrorKind = "node"
	// KindTimeout: no answer within redis.timeout.
	KindTimeout ErrorKind = "timeout"
	// KindBreakerOpen: Redis was not called, the breaker being open.
	KindBreakerOpen ErrorKind = "breaker_open"
	// KindCanceled: the request went away before its decision.
	KindCanceled ErrorKind = "canceled"
)

// ErrorKinds lists every kind, for the metric's series.
func ErrorKinds() []ErrorKind {
	return []ErrorKind{KindData, KindNode, KindTimeout, KindBreakerOpen, KindCanceled}
}

// MovesBreaker reports whether a failure of this kind counts towards opening the breaker: a
// node failing (or not answering) does; a reply about one key's data, or a caller that went
// away, says nothing about the node and must not refuse the other tenants.
func (k ErrorKind) MovesBreaker() bool { return k == KindNode || k == KindTimeout }

// nodeReplies are the error codes with which a Redis node says it cannot serve now, whatever
// the key. Every other error reply is about the call's own data.
var nodeReplies = [...]string{
	"LOADING", "READONLY", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "NOREPLICAS", "BUSY",
	"OOM", "MISCONF", "NOSCRIPT", "MOVED", "ASK", "NOAUTH", "WRONGPASS", "NOPERM",
	"ERR max number of clients",
}

// Classify says what err, from a Store call, tells about Redis. Of several errors joined (a
// Cluster decision over several nodes), the one that says most about the nodes wins.
func Classify(err error) ErrorKind {
	if err == nil {
		return ""
	}
	if k := classifyOne(err); k != "" {
		return k
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return Classify(u.Unwrap())
	case interface{ Unwrap() []error }:
		var kind ErrorKind
		for _, e := range u.Unwrap() {
			if k := Classify(e); precedence(k) > precedence(kind) {
				kind = k
			}
		}
		return kind
	}
	return KindNode // an error of the client or the network we know no better
}

// precedence orders the kinds of joined errors: a caller gone makes the rest moot; a node
// failing says more than a reply about one key.
func precedence(k ErrorKind) int {
	switch k {
	case KindData:
		return 1
	case KindNode:
		return 2
	case KindTimeout:
		return 3
	case KindBreakerOpen:
		return 4
	case KindCanceled:
		return 5
	}
	return 0
}

// classifyOne knows the errors that tell their kind themselves (err alone, not what it
// wraps), or returns "".
func classifyOne(err error) ErrorKind {
	switch err {
	case ErrBreakerOpen:
		return KindBreakerOpen
	case context.Canceled:
		return KindCanceled
	case context.DeadlineExceeded, redis.ErrPoolTimeout:
		return KindTimeout
	case errMalformedReply, ErrInvalidRule:
		return KindData
	}
	switch e := err.(type) {
	case redis.Error:
		msg := e.Error()
		for _, code := range nodeReplies {
			if strings.HasPrefix(msg, code) && (len(msg) == len(code) || msg[len(code)] == ' ') {
				return KindNode
			}
		}
		return KindData
	case net.Error:
		if e.Timeout() {
			return KindTimeout
		}
		return KindNode
	}
	return ""
}

// errMalformedReply is a script reply the client cannot read: about the call's data (a
// number the parser does not take), not about the node.
var errMalformedReply = errors.New("limits: malformed script reply")

// DataError is a reply about the data of one key (see KindData): Key names the Redis key the
// reply is about, or every key of the call when the reply does not say.
type DataError struct {
	Key string
	Err error
}

func (e *DataError) Error() string { return e.Err.Error() }
func (e *DataError) Unwrap() error { return e.Err }

// withKey wraps a data error of a call on keys in a DataError naming the key, which the
// scripts write into their replies as "(key <name>)". Other errors are returned as they are.
func withKey(err error, keys ...[]string) error {
	if err == nil || Classify(err) != KindData {
		return err
	}
	msg := err.Error()
	var all []string
	for _, ks := range keys {
		for _, k := range ks {
			if strings.Contains(msg, "(key "+k+")") {
				return &DataError{Key: k, Err: err}
			}
		}
		all = append(all, ks...)
	}
	return &DataError{Key: strings.Join(all, " "), Err: err}
}
