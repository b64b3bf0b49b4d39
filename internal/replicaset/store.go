package replicaset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/internal/loglimit"
)

// The master's metadata store (MORI's replicas over Redis, Valkey): its
// outage is every replica's alike, one fault, told apart from a replica's
// and said once, naming the store; while it lasts calls answer at once,
// no replica asked, and it is watched for its return.

// ErrStoreUnavailable is the error of a call every replica asked answered
// with its metadata store unavailable (MORI's Redis-backed master).
var ErrStoreUnavailable = errors.New("the master's metadata store is unavailable")

// ErrStoreNotAsked is the error of a call answered at once, no replica
// asked, while the store is said to be out.
var ErrStoreNotAsked = fmt.Errorf("%w (said so before; no replica asked until a check answers otherwise)", ErrStoreUnavailable)

// storeCheckKey is the key a store check looks up: a lookup of no key
// never reads the store.
const storeCheckKey = "umbp-go-store-check"

// storeUnavailableText is how MORI's replicas say their store failed.
const storeUnavailableText = "metadata store unavailable"

// isStoreFault reports whether err is a replica saying its store failed.
func isStoreFault(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.Unavailable && strings.Contains(s.Message(), storeUnavailableText)
}

// storeWatch is the set's view of the replicas' store.
type storeWatch struct {
	replicas []*replica
	masters  string // the replicas' addresses, for logs
	timeout  time.Duration
	log      *slog.Logger
	warn     loglimit.Limiter
	// check takes a replica a call left unanswered to run, which asks it
	// what reads the store.
	check chan *replica
	// out: a replica said its store is unavailable, and no check of the
	// store has answered since; calls answer at once.
	out atomic.Bool
}

func newStoreWatch(replicas []*replica, masters string, timeout time.Duration, log *slog.Logger) *storeWatch {
	return &storeWatch{replicas: replicas, masters: masters, timeout: timeout, log: log, check: make(chan *replica, 1)}
}

// suspect has the store checked through r, which left a call unanswered,
// unless a check is due already.
func (w *storeWatch) suspect(r *replica) {
	select {
	case w.check <- r:
	default:
	}
}

// run asks each replica it is given (suspect) a lookup of one key,
// bounded by timeout, one at a time, and says (down) when the replica
// answers that its store is unavailable. A store stalled under MORI's
// replicas answers so only after its own timeout (1 s), often after the
// caller stopped waiting and ended the call; the probe that follows, a
// lookup of no key, never reads the store, and answers.
//
// While the store is out, it checks again storeCheckEvery after each
// check, through the replicas in turn, until one is answered otherwise.
func (w *storeWatch) run(ctx context.Context) {
	var r *replica
	for next := 0; ; next++ {
		if r == nil {
			select {
			case <-ctx.Done():
				return
			case r = <-w.check:
			}
		}
		cctx, cancel := context.WithTimeout(ctx, w.timeout)
		_, err := r.c.BatchLookup(cctx, []string{storeCheckKey})
		cancel()
		r = nil
		if !isStoreFault(err) {
			if w.out.CompareAndSwap(true, false) {
				w.log.Debug("UMBP master's metadata store answers again", "masters", w.masters)
			}
			continue
		}
		w.down(err)
		select {
		case <-w.check: // this loop watches already
		default:
		}
		t := time.NewTimer(storeCheckEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		r = w.replicas[next%len(w.replicas)]
	}
}

// down says, at most every storeWarnEvery, that the master's store is
// unavailable: the store's fault, every replica's alike, so it names the
// store (the masters), not a replica. Calls answer at once until a check
// of the store is answered (run).
func (w *storeWatch) down(err error) {
	if !w.out.Swap(true) {
		w.suspect(w.replicas[0]) // watch for its return
	}
	if !w.warn.Allow(storeWarnEvery) {
		return
	}
	said := err.Error()
	if s, ok := status.FromError(err); ok {
		said = s.Message()
	}
	if i := strings.Index(said, storeUnavailableText); i >= 0 {
		said = said[i:]
	}
	w.log.Warn("UMBP master's metadata store is unavailable (a replica says so); lookups answer misses until it is back",
		"masters", w.masters, "said", said)
}
