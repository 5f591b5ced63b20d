// Package limits decides requests against several rate limits at once.
//
// A request produces a list of hits (rule + identifier); a Store decides them
// all-or-nothing: either every limit had room and one unit of each was
// consumed, or nothing was consumed.
//
//   - Redis: shared by all gateway replicas. Standalone/sentinel: one script
//     call (EVALSHA, EVAL on NOSCRIPT) per Take, windows computed from Redis
//     TIME so replicas with skewed clocks agree. Cluster: one script call per
//     hash-slot group, pipelined (one round trip per node, in parallel); if a
//     group denies, the others are given back in a second step. That give-back
//     can make a concurrent request see a transient deny, never an overshoot.
//     A *redis.Ring is not supported (its sharding ignores hash tags).
//   - Memory: in-process, 64 shards with their own mutex, its own clock.
//   - Guard: bounds each call by a timeout and fails fast with ErrBreakerOpen
//     while a node the call is bound for keeps failing: one circuit breaker per
//     Redis node (NodeRouter), so a dead Cluster master refuses only its own
//     tenants' calls.
//
// Keys are "<prefix>:<rule name>:{<id>}" for fixed windows of requests
// ("...:tokens:{<id>}" for tokens; counterKeyPart), hashes {s: window start,
// n: count, w: window} expiring at the window end (with Rule.History,
// also the counts of the last ended windows, by start, expiring when the newest
// leaves the kept range: history.go), and
// "<prefix>:<rule name>:<window>:gcra:{<id>}" for GCRA, strings holding the TAT
// exactly like redis_rate/v10 and expiring when fully replenished. The two
// algorithms never share a key, so a limit can change its algorithm (a reload,
// a plan) without a script ever meeting a key of the other type.
//
// A tokens limit with a Reserve holds tokens from admission to Settle, and a
// Streams limit counts answers in flight in "<prefix>:<rule name>:streams:{<id>}";
// both keep their holds as fields of their hash, each expiring on its own (see
// hold.go).
package limits
