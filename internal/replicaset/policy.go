package replicaset

import (
	"time"

	"github.com/umbp-go/umbp-go/internal/backoff"
)

// The set's policy: every pacing, hedging and health figure, in one place.

// Each replica's channel is redialled by gRPC, paced by redial: a replica
// that came back is used again within about its Max. One connection
// attempt may take connectTimeout (gRPC's own default): a replica that
// accepts TCP but does not speak is given up on after it, and the call
// waiting for it ends at its own bound first.
var redial = backoff.Policy{Base: 50 * time.Millisecond, Max: redialMax, Factor: 1.6, Jitter: 0.2}

const redialMax = 250 * time.Millisecond

const connectTimeout = 20 * time.Second

// A set-aside replica is probed every probeInterval, each probe bounded
// by probeTimeout, so one that answers again is used within about their
// sum. Hedges are budgeted as gRFC A6 throttles retries: every call earns
// hedgeRatio of a token, up to hedgeBurst; a hedge spends one: at most
// about one call in 25 is asked twice when the replicas are slow, after a
// burst of hedgeBurst; a hedge for a replica gone or suspect spends none
// (liveness.go). Open gives the other replicas attachGrace once one
// has answered; those still silent are set aside and probed back, and so
// are those a probe of every replica (ProbeAll) finds silent attachGrace
// after another answered. A replica another answered before
// overtakenLimit calls in a row, answering nothing (no call, no beat)
// while each waited, is set aside too. A replica a call's
// context ended on unanswered is suspect: asked only when no other is
// usable, until it answers or suspectFor passes.
const (
	suspectFor     = time.Second
	attachGrace    = 100 * time.Millisecond
	overtakenLimit = 3
	probeInterval  = 250 * time.Millisecond
	probeTimeout   = 250 * time.Millisecond
	hedgeRatio     = 0.04
	hedgeBurst     = 10
)

// Liveness (liveness.go): while calls are in flight every usable replica
// is sent a beat every beatEvery, each given up after beatTimeout; one
// silent for beatSilence (or beatSilenceFactor times what the others'
// beats take, when that is longer: a host where every process answers
// late) while another answered a later beat is gone.
// So a stopped replica is set aside within about beatEvery + beatSilence,
// at 1/beatEvery beats a second to each replica while calls are in flight.
const (
	beatEvery         = 20 * time.Millisecond
	beatSilence       = 50 * time.Millisecond
	beatSilenceFactor = 4
	beatTimeout       = time.Second
)

// A kind of call whose answers take longer than the hedge delay is hedged
// after hedgeLatencyFactor times its moving average instead.
const hedgeLatencyFactor = 3

// storeCheckEvery paces the checks of a store said to be out, at most
// storeChecksEach in flight on a replica; each is answered at once by a
// store that is down (or back), or after the replica's own store timeout
// by one that is stalled. storeWarnEvery is how
// often its outage is said again while it lasts.
const (
	storeCheckEvery = 50 * time.Millisecond
	storeChecksEach = 2
	storeWarnEvery  = 30 * time.Second
)
