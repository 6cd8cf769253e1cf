package fleet_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// A Sentinel failover under load (1 master, 1 replica, 3 sentinels),
// through 3 Caddy processes: keys come in
// one after another (a new one every failoverKeyEvery, each sending a
// request every failoverPace for failoverKeyLife, round-robin over the
// processes, one at a time), so whenever the failover happens some keys are
// half-way through their budget, and live on past the outage it may cause
// (the breaker's cool-down): a decision lost with the old master is given
// again by the new one. Each key is admitted at most its limit
// plus what docs/redis.md ("Sentinel and failover") bounds the loss by on a
// healthy link: the decisions in flight for it when Sluice leaves the old
// master (one here; failoverSlack allows two).
const (
	failoverProcs    = 3
	failoverLimit    = 20
	failoverKeys     = 20
	failoverKeyEvery = 200 * time.Millisecond
	failoverPace     = 40 * time.Millisecond
	failoverKeyLife  = 3 * time.Second
	failoverSlack    = 2
)

const failoverRoutes = `rate_limit {
	zone fo {
		key {http.request.header.X-User}
		events %d
		window 1h
		fail closed
	}
	store redis %s {
		timeout 250ms
	}
}
respond "ok"`

// TestSentinelFailoverFleetManual: SENTINEL FAILOVER (the old master keeps
// running until it is made a replica).
func TestSentinelFailoverFleetManual(t *testing.T) {
	runFailoverFleet(t, "manual", func(t *testing.T, s *redistest.SentinelSet) { s.Failover(t) })
}

// TestSentinelFailoverFleetKill: kill -9 of the master; the sentinels
// promote the replica a second or two later.
func TestSentinelFailoverFleetKill(t *testing.T) {
	runFailoverFleet(t, "kill", func(t *testing.T, s *redistest.SentinelSet) {
		s.Master.Kill()
		_, ok := waitFor(20*time.Second, func() bool {
			v, err := s.Replica.DoErr("ROLE")
			a, _ := v.([]any)
			return err == nil && len(a) > 0 && a[0] == "master"
		})
		if !ok {
			t.Fatalf("the replica %s was not promoted within 20 s of the kill", s.Replica.Addr)
		}
	})
}

func runFailoverFleet(t *testing.T, name string, failover func(*testing.T, *redistest.SentinelSet)) {
	s := redistest.StartSentinels(t, 3)
	url := fmt.Sprintf("redis+sentinel://%s?master_name=%s&addr=%s&addr=%s", s.Sentinels[0].Addr, s.MasterName, s.Sentinels[1].Addr, s.Sentinels[2].Addr)
	procs := make([]*caddyProc, failoverProcs)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("failover-%s-%d", name, i), "", fmt.Sprintf(failoverRoutes, failoverLimit, url))
	}
	c := newClient(failoverKeys)
	defer c.CloseIdleConnections()

	type tally struct{ admitted, refused, unavailable, other int }
	var (
		mu     sync.Mutex
		counts = make([]tally, failoverKeys)
		wg     sync.WaitGroup
	)
	start := time.Now()
	for k := range failoverKeys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start.Add(time.Duration(k) * failoverKeyEvery)))
			user := "X-User: fo-" + name + "-" + strconv.Itoa(k) + "-" + nonce
			for i := 0; i < int(failoverKeyLife/failoverPace); i++ {
				r := send(c, procs[i%failoverProcs].url("/"), user)
				mu.Lock()
				switch {
				case r.err == nil && r.code == 200:
					counts[k].admitted++
				case r.err == nil && r.code == 429:
					counts[k].refused++
				case r.err == nil && r.code == 503:
					counts[k].unavailable++
				default:
					counts[k].other++
				}
				mu.Unlock()
				time.Sleep(failoverPace)
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond) // a few keys spent, a few half-way
	t0 := time.Now()
	failover(t, s)
	t.Logf("failover (%s) took %v", name, time.Since(t0).Round(time.Millisecond))
	wg.Wait()

	over, most, unavailable := 0, 0, 0
	for k, n := range counts {
		most, unavailable = max(most, n.admitted), unavailable+n.unavailable
		if n.other > 0 {
			t.Errorf("key %d: %d requests answered neither 200, 429 nor 503", k, n.other)
		}
		if n.admitted > failoverLimit {
			over++
		}
		if n.admitted > failoverLimit+failoverSlack {
			t.Errorf("key %d: %d admitted of %d (bound %d)", k, n.admitted, failoverLimit, failoverLimit+failoverSlack)
		}
	}
	t.Logf("%d keys of %d over the limit of %d, at most %d admitted; %d answers 503 in all", over, failoverKeys, failoverLimit, most, unavailable)
}
