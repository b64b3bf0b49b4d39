package replicaset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/internal/errdefs"
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
	// store has answered since; calls answer at once. gen counts the
	// times it came back.
	out atomic.Bool
	gen atomic.Uint64
	wg  sync.WaitGroup // the checks in flight
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
// bounded by timeout, and says (down) when the replica answers that its
// store is unavailable. A store stalled under MORI's replicas answers so
// only after its own timeout (1 s), often after the caller stopped
// waiting and ended the call; the probe that follows, a lookup of no key,
// never reads the store, and answers.
//
// While the store is out, it checks again every storeCheckEvery through
// the next replica with fewer than storeChecksEach checks in flight, until
// one is answered otherwise. A check sent to a stopped store waits out
// the replica's own store timeout, and one sent shortly before the store
// resumes is answered when it does: with checks staggered so, a store
// that comes back is heard within about the timeout divided by the checks
// in flight, and each replica holds at most storeChecksEach of its store
// connections for them.
func (w *storeWatch) run(ctx context.Context) {
	defer w.wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-w.check:
			// Out once a replica said so, this check or a call: watched
			// until a check hears it answer (one that hears nothing
			// leaves it out).
			if w.checkOnce(ctx, r, w.gen.Load()) || w.out.Load() {
				w.watchOut(ctx)
			}
		}
	}
}

// checkOnce asks r whether the store answers, as of generation gen (the
// store's returns counted): it reports whether r said it is unavailable.
// A check that began before the store last came back says nothing of it
// now, and neither does one that heard nothing (unheard).
func (w *storeWatch) checkOnce(ctx context.Context, r *replica, gen uint64) bool {
	cctx, cancel := context.WithTimeout(ctx, w.timeout)
	_, err := r.c.BatchLookup(cctx, []string{storeCheckKey})
	cancel()
	if unheard(err) {
		return false
	}
	if !isStoreFault(err) {
		if w.out.CompareAndSwap(true, false) {
			w.gen.Add(1)
			w.log.Debug("UMBP master's metadata store answers again", "masters", w.masters)
		}
		return false
	}
	if w.gen.Load() != gen {
		return false
	}
	w.down(err)
	return true
}

// unheard reports whether err is a check that heard nothing from its
// replica: ended at its bound (a store timeout longer than the check's),
// or the replica went away. Only a replica's answer tells of the store.
func unheard(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		(errors.Is(err, errdefs.ErrUnavailable) && !isStoreFault(err))
}

// watchOut checks the store through the replicas while it is out.
func (w *storeWatch) watchOut(ctx context.Context) {
	n := len(w.replicas)
	done := make(chan int, n*storeChecksEach)
	busy := make([]int, n)
	tick := time.NewTicker(storeCheckEvery)
	defer tick.Stop()
	for next := 0; w.out.Load(); {
		select {
		case <-ctx.Done():
			return
		case i := <-done:
			busy[i]--
			continue
		case <-w.check: // watched already
			continue
		case <-tick.C:
		}
		for k := range n {
			i := (next + k) % n
			if busy[i] >= storeChecksEach {
				continue
			}
			busy[i]++
			next = i + 1
			gen := w.gen.Load()
			w.wg.Go(func() {
				w.checkOnce(ctx, w.replicas[i], gen)
				done <- i
			})
			break
		}
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
