package umbp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/errdefs"
)

// scriptTransport answers each move with the next of its answers.
type scriptTransport struct {
	answers []func(items []item) ([]bool, []error)
	moves   int
}

func (s *scriptTransport) move(_ context.Context, _ jobKind, items []item) results {
	a := s.answers[min(s.moves, len(s.answers)-1)]
	s.moves++
	ok, errs := a(items)
	return results{ok: ok, errs: errs}
}
func (s *scriptTransport) flush(context.Context) error { return nil }
func (s *scriptTransport) ranged() bool                { return true }
func (s *scriptTransport) conn() *conn.Conn            { return nil }

func scriptWorker() *jobRunner {
	return &jobRunner{
		link:    &link{kickc: make(chan struct{}, 1)},
		log:     slog.New(slog.DiscardHandler),
		timeout: time.Minute,
		jobs:    newTestSet(),
	}
}

func scriptJob(w *jobRunner, kind jobKind, keys ...string) (*TransferJob, []item) {
	plans := make([]BlockTransferPlan, len(keys))
	items := make([]item, len(keys))
	for i, k := range keys {
		plans[i] = BlockTransferPlan{Key: k}
		items[i] = item{idx: i, obj: conn.Object{Key: k, Size: 8}, single: true, host: true}
	}
	j := newJob(kind, plans, w.jobs, "unix:///test.grpc.sock")
	j.sizes = make([]uint64, len(keys))
	j.submit(nil, nil)
	return j, items
}

// A key failed as not attempted (no staging buffer while reconnecting:
// errReconnecting, which matches ErrUnavailable) sent nothing: the job
// ends with its outcome, it is not held as if the server might still use
// its memory.
func TestNotAttemptedIsNotInDoubt(t *testing.T) {
	w := scriptWorker()
	job, items := scriptJob(w, kindLoad, "a", "b") // a load: no retries
	tr := &scriptTransport{answers: []func([]item) ([]bool, []error){
		func(items []item) ([]bool, []error) {
			return []bool{true, false}, []error{nil, notAttempted(fmt.Errorf("staging buffer: %w", errReconnecting))}
		},
	}}
	if done := w.run(job, tr, items, nil); !done {
		t.Fatal("the job was detached as if a request were in doubt")
	}
	select {
	case <-job.Done():
	default:
		t.Fatal("the job did not end")
	}
	if job.KeyErr(0) != nil || !errors.Is(job.KeyErr(1), ErrNotAttempted) {
		t.Fatalf("key errors %v, %v; want nil, not attempted", job.KeyErr(0), job.KeyErr(1))
	}
}

// A retried key ends with its retry's answer, not its first request's.
func TestStoreRetryKeepsLastError(t *testing.T) {
	w := scriptWorker()
	job, items := scriptJob(w, kindStore, "a")
	refused := &conn.RefusedError{Op: "BatchPut", Reason: "the pool is full of pinned objects"}
	tr := &scriptTransport{answers: []func([]item) ([]bool, []error){
		func([]item) ([]bool, []error) { return []bool{false}, nil }, // a plain refusal
		func([]item) ([]bool, []error) { return []bool{false}, []error{refused} },
	}}
	if done := w.run(job, tr, items, nil); !done {
		t.Fatal("detached")
	}
	<-job.Done()
	if err := job.KeyErr(0); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), refused.Reason) {
		t.Fatalf("key error %v, want the retry's refusal with its reason", err)
	}

	// Not attempted first, then a retry whose transport failed: the key was
	// sent, so it is not reported as not attempted.
	w = scriptWorker()
	job, items = scriptJob(w, kindStore, "b")
	cut := fmt.Errorf("BatchPut: %w: connection reset", errdefs.ErrUnavailable)
	tr = &scriptTransport{answers: []func([]item) ([]bool, []error){
		func([]item) ([]bool, []error) {
			return []bool{false}, []error{notAttempted(errors.New("waiting for another registration"))}
		},
		func([]item) ([]bool, []error) { return []bool{false}, []error{cut} },
	}}
	r := tr.move(context.Background(), kindStore, items)
	lost := w.retryStores(context.Background(), tr, items, &r, time.Now().Add(time.Minute))
	if lost != cut || r.err(0) != cut || errors.Is(r.err(0), ErrNotAttempted) {
		t.Fatalf("retry lost %v, key error %v; want the retry's transport failure", lost, r.err(0))
	}
	job.failRest(nil)
}
