package umbp

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/umbp-go/umbp-go/internal/hip"
)

// A transfer may wait, before it touches the plans' memory (a store's source,
// a load's destination), for the work queued so far on the engine's GPU
// stream (AfterStream): an event recorded when the transfer is submitted,
// polled by the transfer until the stream has reached it or the transfer's
// deadline has passed.

// TransferOption adjusts one transfer: a store or a load.
type TransferOption func(*transferOptions)

type transferOptions struct {
	stream *streamDep // AfterStream
}

// streamDep is an AfterStream dependency.
type streamDep struct {
	device int
	stream uintptr
}

// AfterStream makes a transfer wait, before it touches the plans' memory,
// for the work queued so far on the engine's GPU stream (a HIP or CUDA
// stream handle on device; 0 is the default stream): a store reads its
// source only once the kernels queued before it have written it, and a load
// writes its destination only once the kernels queued before it have
// finished reading it. An event is recorded on the stream when the transfer
// is submitted, and the transfer waits for it. A stream that has not got
// there within Config.Timeout of the transfer's start fails the transfer as
// not attempted, having sent nothing (a load's destination is untouched).
// Without a GPU runtime the transfer fails as not attempted.
func AfterStream(device int, stream uintptr) TransferOption {
	return func(o *transferOptions) { o.stream = &streamDep{device: device, stream: stream} }
}

// streamEvent is an AfterStream dependency in flight: an event recorded on
// the engine's stream when the transfer was submitted.
type streamEvent struct {
	rt  *hip.Runtime
	dep streamDep
	ev  hip.Event
	log *slog.Logger
}

// recordStream records the AfterStream event of o, if any. The transfer
// calls wait before it sends anything, and so before the server or a
// staging copy touches the plans' memory (a store's source, a load's
// destination); the job releases the event in every case.
func recordStream(o transferOptions, log *slog.Logger) (*streamEvent, error) {
	if o.stream == nil {
		return nil, nil
	}
	d := *o.stream
	rt, err := loadGPU(log)
	if err != nil {
		return nil, fmt.Errorf("AfterStream: %w", err)
	}
	ev, err := rt.EventCreate(d.device)
	if err != nil {
		return nil, fmt.Errorf("AfterStream: create an event on device %d: %w", d.device, err)
	}
	e := &streamEvent{rt: rt, dep: d, ev: ev, log: log}
	if err := rt.EventRecord(d.device, ev, hip.Stream(d.stream)); err != nil {
		e.release()
		return nil, fmt.Errorf("AfterStream: record an event on stream %#x of device %d: %w", d.stream, d.device, err)
	}
	return e, nil
}

// wait returns once the engine's stream has reached the event, or with an
// error when deadline passes first. It polls rather than blocks in the
// runtime, so a stream that never gets there (a hung kernel) holds the
// transfer goroutine until the deadline only, and the transfer fails having
// sent nothing.
func (e *streamEvent) wait(deadline time.Time) error {
	var pause time.Duration
	for {
		done, err := e.rt.EventQuery(e.dep.device, e.ev)
		if err != nil {
			return fmt.Errorf("wait for stream %#x of device %d: %w", e.dep.stream, e.dep.device, err)
		}
		if done {
			return nil
		}
		if testHookStreamPending != nil {
			testHookStreamPending()
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("stream %#x of device %d: %w", e.dep.stream, e.dep.device, errStreamLate)
		}
		pause = streamPolling.Next(pause)
		time.Sleep(min(pause, left))
	}
}

// testHookStreamPending, when set by a test, runs each time a transfer finds
// that the engine's stream has not reached its event yet.
var testHookStreamPending func()

// release destroys the event. The runtimes allow this before the stream has
// reached it: they free it once it has.
func (e *streamEvent) release() {
	if err := e.rt.EventDestroy(e.dep.device, e.ev); err != nil {
		e.log.Warn("UMBP standalone: destroy a GPU event", "device", e.dep.device, "err", err)
	}
}
