package replicaset

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/umbp-go/umbp-go/internal/errdefs"
)

// ProbeAll asks every usable replica at once for a lookup of no key, as a
// call's caller does once the call went unanswered: the first to answer
// (or to say its store is down: it is alive) ends it, and of the others
// those still silent attachGrace later are set aside, stalled. It returns
// once one answers, every one failed (their errors), or ctx ends.
func (s *Set) ProbeAll(ctx context.Context) error {
	var asked []*replica
	for _, r := range s.replicas {
		if r.usable() {
			asked = append(asked, r)
		}
	}
	if len(asked) == 0 {
		return ErrNoReplica
	}
	pctx, cancel := context.WithCancel(ctx)
	results := make(chan probeResult, len(asked))
	for _, r := range asked {
		go func() { results <- probeResult{r, r.c.ProbeLookup(pctx)} }()
	}
	var errs []error
	for left := len(asked); left > 0; left-- {
		var x probeResult
		select {
		case x = <-results:
		case <-ctx.Done():
			cancel()
			return ctx.Err()
		}
		asked = slices.DeleteFunc(asked, func(r *replica) bool { return r == x.r })
		if x.err != nil && !isStoreFault(x.err) {
			errs = append(errs, fmt.Errorf("%s: %w", x.r.addr, x.err))
			if errors.Is(x.err, errdefs.ErrUnavailable) {
				s.setAside(x.r, x.err.Error())
			}
			continue
		}
		x.r.alive()
		if x.err != nil {
			s.store.down(x.err)
		} else {
			s.last.Store(int32(x.r.idx))
		}
		if left > 1 {
			// The others' probes are not waited for.
			go s.setAsideSilent(asked, results, left-1, cancel)
		} else {
			cancel()
		}
		return nil
	}
	cancel()
	return errors.Join(errs...)
}

// probeResult is one replica's answer to ProbeAll's probe.
type probeResult struct {
	r   *replica
	err error
}

// setAsideSilent sets aside those of asked whose probe, still out on
// results (n of them), has not answered within attachGrace; then it ends
// them.
func (s *Set) setAsideSilent(asked []*replica, results <-chan probeResult, n int, cancel context.CancelFunc) {
	defer cancel()
	silent := map[*replica]bool{}
	for _, r := range asked {
		silent[r] = true
	}
	grace := time.NewTimer(attachGrace)
	defer grace.Stop()
wait:
	for ; n > 0; n-- {
		select {
		case x := <-results:
			delete(silent, x.r)
			if x.err == nil || isStoreFault(x.err) {
				x.r.alive()
			}
		case <-grace.C:
			break wait
		}
	}
	for _, r := range asked {
		if silent[r] && n > 0 {
			s.setAside(r, fmt.Sprintf("silent %v after another answered", attachGrace))
		}
	}
}
