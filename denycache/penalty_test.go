package denycache

import (
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Penalties and refundable zones (see the package comment): a key in its
// penalty is answered locally, exactly as the store answers it, until the
// penalty ends; a request that would start a penalty is left to the store
// (which writes it); a refundable zone is answered only by its penalty.
func TestPenaltiesAndRefundableZones(t *testing.T) {
	pen := lim
	pen.Penalty = 60_000
	inPenalty := spent(5)
	inPenalty.Penalized = t0
	decide := func(c *Cache, r algorithms.Request, elapsed time.Duration) (algorithms.Decision, bool) {
		out := make([]algorithms.Decision, 1)
		hit := c.Decide([]algorithms.Request{r}, Now()+int64(elapsed), out)
		return out[0], hit
	}

	t.Run("in its penalty", func(t *testing.T) {
		c := armed(100)
		r := algorithms.Request{Zone: "p", Key: key(1), Limit: pen, Cost: 1}
		first := remember(c, c.Token(), Now(), []algorithms.Request{r}, []algorithms.State{inPenalty})
		if first[0].Allowed || first[0].RetryAfter != time.Minute {
			t.Fatalf("the store's answer in the penalty: %+v", first[0])
		}
		for _, after := range []time.Duration{0, time.Second, 30 * time.Second, 59 * time.Second} {
			d, hit := decide(c, r, after)
			want := storeAnswer([]algorithms.Request{r}, []algorithms.State{inPenalty}, t0+after.Milliseconds())[0]
			if !hit || d.Allowed || d.Remaining != 0 {
				t.Fatalf("%v into the penalty: hit %v, %+v; want a refusal", after, hit, d)
			}
			if diff := d.RetryAfter - want.RetryAfter; diff < -2*time.Millisecond || diff > 2*time.Millisecond {
				t.Fatalf("%v into the penalty: Retry-After %v, the store's %v", after, d.RetryAfter, want.RetryAfter)
			}
		}
		// Once the penalty is over the bucket (refilled by then) decides:
		// the store.
		if d, hit := decide(c, r, 61*time.Second); hit {
			t.Fatalf("after the penalty: answered locally %+v", d)
		}
	})

	t.Run("a refusal that would start a penalty", func(t *testing.T) {
		c := armed(100)
		r := algorithms.Request{Zone: "p", Key: key(2), Limit: pen, Cost: 1}
		// The entry's bucket refuses (all spent, no penalty running): the
		// store would write a penalty, so the cache must not answer.
		out := storeAnswer([]algorithms.Request{r}, []algorithms.State{spent(5)}, t0)
		c.Remember(c.Token(), Now(), t0, []algorithms.Request{r}, out, []Snapshot{{State: spent(5), Known: true}})
		if d, hit := decide(c, r, 0); hit {
			t.Fatalf("answered locally %+v; the store must start the penalty", d)
		}
		// A report-only zone's would-be penalty is written too.
		ro := r
		ro.ReportOnly = true
		other := algorithms.Request{Zone: "q", Key: key(2), Limit: lim, Cost: 1}
		states := []algorithms.State{spent(5), spent(5)}
		reqs := []algorithms.Request{ro, other}
		out = storeAnswer(reqs, states, t0)
		c.Remember(c.Token(), Now(), t0, reqs, out, []Snapshot{{State: states[0], Known: true}, {State: states[1], Known: true}})
		got := make([]algorithms.Decision, 2)
		if c.Decide(reqs, Now(), got) {
			t.Fatalf("answered locally %+v; the store must start the report-only zone's penalty", got)
		}
	})

	t.Run("refundable zones", func(t *testing.T) {
		c := armed(100)
		r := algorithms.Request{Zone: "c", Key: key(3), Limit: lim, Cost: 1, Refundable: true}
		remember(c, c.Token(), Now(), []algorithms.Request{r}, []algorithms.State{spent(5)})
		if d, hit := decide(c, r, 0); hit {
			t.Fatalf("a refundable zone's bucket refusal answered locally %+v: a refund may lift it", d)
		}
		rp := algorithms.Request{Zone: "cp", Key: key(3), Limit: pen, Cost: 1, Refundable: true}
		remember(c, c.Token(), Now(), []algorithms.Request{rp}, []algorithms.State{inPenalty})
		if d, hit := decide(c, rp, time.Second); !hit || d.Allowed {
			t.Fatalf("a refundable zone in its penalty: hit %v %+v, want a local refusal", hit, d)
		}
		// A refundable zone beside a zone whose bucket refuses: the other
		// zone's refusal is answered.
		other := algorithms.Request{Zone: "o", Key: key(3), Limit: lim, Cost: 1}
		cz := algorithms.Request{Zone: "c2", Key: key(3), Limit: lim, Cost: 1, Refundable: true}
		reqs := []algorithms.Request{cz, other}
		remember(c, c.Token(), Now(), reqs, []algorithms.State{spent(1), spent(5)})
		got := make([]algorithms.Decision, 2)
		if !c.Decide(reqs, Now(), got) || got[1].Allowed || !got[0].Allowed {
			t.Fatalf("a refusal by a non-refundable zone beside a refundable one: %+v", got)
		}
	})
}
