// Package umbpprometheus exports the Stats of umbp handles as Prometheus
// metrics. It lives in its own module, so that the core module does not
// require the Prometheus client.
//
//	c := umbpprometheus.NewCollector()
//	c.Add("scheduler", sched)   // a *umbp.SchedulerHandle
//	c.Add("worker-tp0", worker) // a *umbp.WorkerHandle
//	prometheus.MustRegister(c)
//
// Every metric carries the label "handle", the name given to Add. Counters
// are the handle's own since it was created; gauges are read at each
// scrape. A scheduler handle exports the lookup metrics (its
// Stats.Lookups), a worker handle the transfer metrics (its Stats.Transfers),
// and both the state and reconnect metrics. A scheduler handle on MORI's
// master exports each replica's metrics too, labelled with its address
// ("replica").
package umbpprometheus

import (
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/umbp-go/umbp-go/umbp"
)

// StatsSource is what the collector reads: *umbp.SchedulerHandle and
// *umbp.WorkerHandle are StatsSources.
type StatsSource interface {
	Stats() umbp.Stats
}

// Collector is a prometheus.Collector for the Stats of named handles. It is
// safe for concurrent use.
type Collector struct {
	mu      sync.Mutex
	handles map[string]StatsSource

	state, rangedIO, reconnects                           *prometheus.Desc
	lookups, hits, misses, timeouts, failures, unasked    *prometheus.Desc
	cancelled                                             *prometheus.Desc
	submitted, completed, failed, refused, blocked        *prometheus.Desc
	bytesStored, bytesLoaded, abandonedBufs, abandonedLen *prometheus.Desc
	replicaUp, replicaAside, replicaCalls, replicaHedges  *prometheus.Desc
	replicaAnswers, replicaSetAsides, replicaLatency      *prometheus.Desc
}

// NewCollector returns a collector with no handles; metric names start with
// "umbp_".
func NewCollector() *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("umbp_"+name, help, append([]string{"handle"}, labels...), nil)
	}
	return &Collector{
		handles:       map[string]StatsSource{},
		state:         d("handle_state", "1 for the handle's current state (connected, reconnecting or closed), 0 for the others.", "state"),
		rangedIO:      d("server_ranged_io", "1 if the server the handle last attached to takes scatter/gather batches (v2, SSD tier off)."),
		reconnects:    d("reconnects_total", "Attachments to a new server after the first."),
		lookups:       d("lookups_total", "Scheduler calls that asked the server about keys."),
		hits:          d("lookup_hits_total", "Keys answered present."),
		misses:        d("lookup_misses_total", "Keys answered absent, and the keys of calls that failed, timed out or went unasked (not those of calls their callers left)."),
		timeouts:      d("lookup_timeouts_total", "Scheduler calls that got no reply within LookupTimeout."),
		failures:      d("lookup_failures_total", "Scheduler calls that failed or were refused (not timeouts)."),
		unasked:       d("lookup_unasked_total", "Scheduler calls answered misses at once without asking a server (held off, reconnecting, closed, or the master's store said out)."),
		cancelled:     d("lookup_cancelled_total", "Scheduler calls whose caller's context ended before they were answered: the caller's doing, not the server's."),
		submitted:     d("transfers_submitted_total", "Transfer jobs handed to the transfer goroutines."),
		completed:     d("transfers_completed_total", "Transfer jobs that ended COMPLETED."),
		failed:        d("transfers_failed_total", "Transfer jobs that ended FAILED or CANCELLED after submission."),
		refused:       d("transfers_refused_total", "Transfer jobs failed as not attempted before submission."),
		blocked:       d("transfers_blocked", "Transfers past their deadline on the current server; new ones are refused meanwhile."),
		bytesStored:   d("stored_bytes_total", "Object bytes of keys stored."),
		bytesLoaded:   d("loaded_bytes_total", "Object bytes of keys loaded."),
		abandonedBufs: d("abandoned_buffers", "Buffers that Close left registered because transfers still held them."),
		abandonedLen:  d("abandoned_bytes", "Bytes of the registered regions of abandoned buffers."),

		replicaUp:        d("master_replica_up", "1 while calls go to the master replica (its channel up, not set aside).", "replica"),
		replicaAside:     d("master_replica_set_aside", "1 while the master replica is set aside (stalled or refusing) and probed.", "replica"),
		replicaCalls:     d("master_replica_calls_total", "Calls sent to the master replica, hedges included.", "replica"),
		replicaHedges:    d("master_replica_hedges_total", "Calls sent to the master replica because another had not answered within the hedge delay.", "replica"),
		replicaAnswers:   d("master_replica_answers_total", "The master replica's answers that were used.", "replica"),
		replicaSetAsides: d("master_replica_set_asides_total", "Times the master replica was set aside.", "replica"),
		replicaLatency:   d("master_replica_latency_seconds", "A moving average of the master replica's answers' time.", "replica"),
	}
}

// Add exports h's Stats under the label handle=name, replacing a handle
// added under the same name.
func (c *Collector) Add(name string, h StatsSource) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handles[name] = h
}

// Remove stops exporting the handle added under name.
func (c *Collector) Remove(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.handles, name)
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.state, c.rangedIO, c.reconnects,
		c.lookups, c.hits, c.misses, c.timeouts, c.failures, c.unasked, c.cancelled,
		c.submitted, c.completed, c.failed, c.refused, c.blocked,
		c.bytesStored, c.bytesLoaded, c.abandonedBufs, c.abandonedLen,
		c.replicaUp, c.replicaAside, c.replicaCalls, c.replicaHedges,
		c.replicaAnswers, c.replicaSetAsides, c.replicaLatency,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: it reads every handle's Stats.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	names := make([]string, 0, len(c.handles))
	for n := range c.handles {
		names = append(names, n)
	}
	sort.Strings(names)
	handles := make([]StatsSource, len(names))
	for i, n := range names {
		handles[i] = c.handles[n]
	}
	c.mu.Unlock()

	for i, h := range handles {
		name, s := names[i], h.Stats()
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{name}, labels...)...)
		}
		counter := func(d *prometheus.Desc, v uint64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{name}, labels...)...)
		}
		for _, st := range []umbp.HandleState{umbp.StateConnected, umbp.StateReconnecting, umbp.StateClosed} {
			gauge(c.state, b2f(s.State == st), st.String())
		}
		gauge(c.rangedIO, b2f(s.Capabilities.RangedIO))
		counter(c.reconnects, s.Reconnects)
		_, worker := h.(*umbp.WorkerHandle)
		_, scheduler := h.(*umbp.SchedulerHandle)
		if !worker {
			l := s.Lookups
			counter(c.lookups, l.Calls)
			counter(c.hits, l.Hits)
			counter(c.misses, l.Misses)
			counter(c.timeouts, l.Timeouts)
			counter(c.failures, l.Failures)
			counter(c.unasked, l.Unasked)
			counter(c.cancelled, l.Cancelled)
		}
		for _, r := range s.Replicas {
			gauge(c.replicaUp, b2f(r.State == umbp.StateConnected), r.Addr)
			gauge(c.replicaAside, b2f(r.SetAside), r.Addr)
			counter(c.replicaCalls, r.Calls, r.Addr)
			counter(c.replicaHedges, r.Hedges, r.Addr)
			counter(c.replicaAnswers, r.Answers, r.Addr)
			counter(c.replicaSetAsides, r.SetAsides, r.Addr)
			gauge(c.replicaLatency, r.Latency.Seconds(), r.Addr)
		}
		if !scheduler {
			x := s.Transfers
			counter(c.submitted, x.Submitted)
			counter(c.completed, x.Completed)
			counter(c.failed, x.Failed)
			counter(c.refused, x.Refused)
			gauge(c.blocked, float64(x.Blocked))
			counter(c.bytesStored, x.BytesStored)
			counter(c.bytesLoaded, x.BytesLoaded)
			gauge(c.abandonedBufs, float64(x.AbandonedBuffers))
			gauge(c.abandonedLen, float64(x.AbandonedBytes))
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
