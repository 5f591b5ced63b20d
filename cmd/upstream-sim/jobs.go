package main

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Fixed values the simulated agent reports for every job.
const (
	simRepository = "acme/docs"
	simRef        = "main"
	simModel      = "claude-sonnet-4-5"
	simPRBase     = "https://github.com/acme/docs/pull/"
)

// job is one agent job. Its status is derived from the clock: active until
// doneAt, completed (with a pull request) from then on.
type job struct {
	id        string
	projectID string
	createdAt time.Time
	doneAt    time.Time // when it flips to completed
	prNumber  int64
	messages  int // follow-up messages received
}

// jobStore is a bounded in-memory map of jobs; past max entries the oldest
// job (by creation) is evicted.
type jobStore struct {
	mu     sync.Mutex
	jobs   map[string]*job
	order  []string // ring of ids in creation order, grows up to max
	next   int      // ring slot to overwrite once len(order) == max
	max    int
	lastPR int64
}

func newJobStore(max int) *jobStore {
	return &jobStore{jobs: make(map[string]*job), max: max}
}

// add stores j, assigns its pull-request number and evicts the oldest job
// when the store is full.
func (s *jobStore) add(j *job) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastPR++
	j.prNumber = s.lastPR
	if len(s.order) < s.max {
		s.order = append(s.order, j.id)
	} else {
		delete(s.jobs, s.order[s.next])
		s.order[s.next] = j.id
		s.next = (s.next + 1) % s.max
	}
	s.jobs[j.id] = j
}

// snapshot returns a copy of the job of projectID with id, if any; update,
// when non-nil, is applied under the lock first.
func (s *jobStore) snapshot(projectID, id string, update func(*job)) (job, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[id]
	if !ok || j.projectID != projectID {
		return job{}, false
	}
	if update != nil {
		update(j)
	}
	return *j, true
}

func (s *jobStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.jobs)
}

type jobService struct {
	cfg   simConfig
	store *jobStore
}

// promptBody is the body of job creation and of follow-up messages.
type promptBody struct {
	Prompt *string `json:"prompt"`
}

// readPrompt authenticates the request and returns its prompt; on failure it
// has answered the request and returns ok == false.
func readPrompt(w http.ResponseWriter, r *http.Request) (prompt string, ok bool) {
	if bearerToken(r) == "" {
		writeRaw(w, http.StatusUnauthorized, errAuthBody)
		return "", false
	}
	buf := readBody(w, r)
	if buf == nil {
		return "", false
	}
	defer putBuf(buf)
	var body promptBody
	if err := json.Unmarshal(buf.Bytes(), &body); err != nil {
		writeError(w, http.StatusBadRequest, "request body must be a JSON object with a string field prompt")
		return "", false
	}
	if body.Prompt == nil {
		writeError(w, http.StatusBadRequest, "prompt is required")
		return "", false
	}
	if *body.Prompt == "" {
		writeError(w, http.StatusBadRequest, "prompt must be a non-empty string")
		return "", false
	}
	return *body.Prompt, true
}

// authOnly checks the bearer token of a request without a body.
func authOnly(w http.ResponseWriter, r *http.Request) bool {
	if bearerToken(r) == "" {
		writeRaw(w, http.StatusUnauthorized, errAuthBody)
		return false
	}
	return true
}

// create handles POST /v2/agent/{projectId}/job.
func (s *jobService) create(w http.ResponseWriter, r *http.Request) {
	if _, ok := readPrompt(w, r); !ok {
		return
	}
	now := s.cfg.Now()
	j := &job{
		id:        newUUID(),
		projectID: r.PathValue("projectId"),
		createdAt: now,
		doneAt:    now.Add(s.cfg.JobCompleteAfter),
	}
	s.store.add(j)
	s.writeJob(w, http.StatusCreated, *j, now)
}

// get handles GET /v2/agent/{projectId}/job/{jobId}.
func (s *jobService) get(w http.ResponseWriter, r *http.Request) {
	if !authOnly(w, r) {
		return
	}
	j, ok := s.store.snapshot(r.PathValue("projectId"), r.PathValue("jobId"), nil)
	if !ok {
		writeRaw(w, http.StatusNotFound, errJobNotFoundBody)
		return
	}
	s.writeJob(w, http.StatusOK, j, s.cfg.Now())
}

// message handles POST /v2/agent/{projectId}/job/{jobId}/message: the job
// goes back to active for another -job-complete-after, then completes again
// (same pull request).
func (s *jobService) message(w http.ResponseWriter, r *http.Request) {
	if _, ok := readPrompt(w, r); !ok {
		return
	}
	now := s.cfg.Now()
	j, ok := s.store.snapshot(r.PathValue("projectId"), r.PathValue("jobId"), func(j *job) {
		j.doneAt = now.Add(s.cfg.JobCompleteAfter)
		j.messages++
	})
	if !ok {
		writeRaw(w, http.StatusNotFound, errJobNotFoundBody)
		return
	}
	s.writeJob(w, http.StatusOK, j, now)
}

// writeJob encodes the job object of the spec (part 2.1) by hand: every
// string in it is generated here or is a fixed constant, except the ids
// which are escaped anyway.
func (s *jobService) writeJob(w http.ResponseWriter, code int, j job, now time.Time) {
	bp := outPool.Get().(*[]byte)
	b := appendJob((*bp)[:0], j, now)
	w.Header()["Content-Type"] = appJSON
	w.WriteHeader(code)
	_, _ = w.Write(b)
	*bp = b
	outPool.Put(bp)
}

// outPool holds scratch slices for encoding responses.
var outPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// appendJob appends the JSON job object as seen at time now.
func appendJob(b []byte, j job, now time.Time) []byte {
	done := !now.Before(j.doneAt)
	b = append(b, `{"id":`...)
	b = appendJSONString(b, j.id)
	if done {
		b = append(b, `,"status":"completed"`...)
	} else {
		b = append(b, `,"status":"active"`...)
	}
	b = append(b, `,"source":{"repository":"`+simRepository+`","ref":"`+simRef+`"},"model":"`+simModel+`","prLink":`...)
	if done {
		b = append(b, `"`+simPRBase...)
		b = strconv.AppendInt(b, j.prNumber, 10)
		b = append(b, '"')
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"createdAt":"`...)
	b = j.createdAt.UTC().AppendFormat(b, "2006-01-02T15:04:05.000Z")
	b = append(b, `","archivedAt":null}`...)
	return b
}

// newUUID returns a random version-4 UUID string. math/rand/v2's global
// generator is a per-thread ChaCha8 stream: fast, lock-free and unpredictable
// enough for a simulator.
func newUUID() string {
	const hex = "0123456789abcdef"
	var u [16]byte
	a, c := rand.Uint64(), rand.Uint64()
	for i := 0; i < 8; i++ {
		u[i] = byte(a >> (8 * i))
		u[8+i] = byte(c >> (8 * i))
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	var out [36]byte
	o := 0
	for i, x := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out[o] = '-'
			o++
		}
		out[o], out[o+1] = hex[x>>4], hex[x&0xf]
		o += 2
	}
	return string(out[:])
}

// randomHex returns n random lowercase hex characters.
func randomHex(n int) string {
	const hex = "0123456789abcdef"
	b := make([]byte, n)
	var x uint64
	for i := range b {
		if i%16 == 0 {
			x = rand.Uint64()
		}
		b[i] = hex[x&0xf]
		x >>= 4
	}
	return string(b)
}
