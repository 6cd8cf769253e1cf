package adaptive

import (
	"math/rand/v2"
	"slices"
	"time"
)

// bed is the testbed's upstream beyond its tail: the scenarios of
// scenarios_test.go. The zero bed (but sigma) is the original testbed.
type bed struct {
	sigma float64
	// noisy: the host is busy with other work (host).
	noisy bool
	// hits: the share of requests that are cache hits (testbedHit, no
	// worker); the misses then take median/(1-hits), so the knee's
	// capacity is the same.
	hits float64
	// classes: hits and misses each have their own limiter (a zone keyed
	// on the class of request).
	classes bool
	// long: the share of long responses: a first byte after a service
	// time on a worker, then testbedLongFor more without one (an event
	// stream, NDJSON, a download, a gRPC server stream, a WebSocket: the
	// upstream writes them as the client reads).
	long float64
	// longs: what a long response holds and what it measures.
	longs longPolicy
}

// longPolicy is what the limiter counts and measures of a long response.
type longPolicy int

const (
	// longFree: it gives its place back at its first byte, sampled there.
	longFree longPolicy = iota
	// longHold: it holds its place to its end, sampled at its first byte.
	longHold
	// longWhole: it holds its place to its end, sampled there.
	longWhole
)

const (
	testbedHit     = 2 * time.Millisecond
	testbedLongFor = 10 * time.Second
)

// host is the noisy host: a CPU-bound process beside the upstream and
// Caddy taking a core of two. The upstream's service times are stretched
// by a factor drawn every hostEpoch (the share of the CPU left to it),
// the host stalls now and then (a GC pause, a noisy neighbour: nothing
// completes until the stall ends, so every request in flight is late at
// once), and each measured latency carries the scheduling delay of the
// goroutine that sees the first byte. A quiet host (nil) has none.
type host struct {
	rng    *rand.Rand
	slows  []float64       // the factor, by epoch
	stalls []time.Duration // start, end, start, end...
}

// The noisy host's parameters.
const (
	hostEpoch     = time.Second
	hostSlowMax   = 1.6                   // service times × 1…hostSlowMax
	hostStallGap  = time.Second           // mean time between stalls
	hostStallMax  = 80 * time.Millisecond // a stall lasts 0…hostStallMax
	hostJitterAvg = 4 * time.Millisecond  // the scheduling delay's mean
)

// capacity is b's capacity at testbedMedian, per second: the noisy host's
// share of the CPU (its mean stretch, less its stalls) of the quiet one's.
func (b bed) capacity() float64 {
	c := testbedCapacity(b.sigma)
	if b.noisy {
		stall := float64(hostStallMax) / 2
		c *= 2 / (1 + hostSlowMax) * float64(hostStallGap) / (float64(hostStallGap) + stall)
	}
	return c
}

func newHost(noisy bool, seed uint64, span time.Duration) *host {
	if !noisy {
		return nil
	}
	h := &host{rng: rand.New(rand.NewPCG(seed, 2))}
	for range span / hostEpoch {
		h.slows = append(h.slows, 1+(hostSlowMax-1)*h.rng.Float64())
	}
	for at := time.Duration(0); at < span; {
		at += time.Duration(h.rng.ExpFloat64() * float64(hostStallGap))
		end := at + time.Duration(h.rng.Float64()*float64(hostStallMax))
		h.stalls = append(h.stalls, at, end)
		at = end
	}
	return h
}

// slow is a service time d started at at, stretched by the CPU left.
func (h *host) slow(at, d time.Duration) time.Duration {
	if h == nil {
		return d
	}
	return time.Duration(float64(d) * h.slows[min(int(at/hostEpoch), len(h.slows)-1)])
}

// stalled returns when something due at at can happen: at, or the end of
// the stall at falls in.
func (h *host) stalled(at time.Duration) time.Duration {
	if h == nil {
		return at
	}
	i, _ := slices.BinarySearch(h.stalls, at)
	if i%2 == 1 { // between a start and its end
		return h.stalls[i]
	}
	return at
}

// jitter is one measurement's scheduling delay.
func (h *host) jitter() time.Duration {
	if h == nil {
		return 0
	}
	return time.Duration(h.rng.ExpFloat64() * float64(hostJitterAvg))
}
