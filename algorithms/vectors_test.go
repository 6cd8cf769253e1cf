package algorithms_test

import (
	"testing"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/algorithms/vectortest"
)

// Every shared vector (testdata/*.json) through Step (and GiveBack, for a
// refund step). The memory store and the Lua twin in Redis run the very
// same files (memstore and redisstore tests).
func TestVectors(t *testing.T) {
	for _, v := range vectortest.Load(t) {
		t.Run(v.File+"/"+v.Name, func(t *testing.T) {
			var st algorithms.State
			fresh := true
			for i, s := range v.Compile(t) {
				if s.Settle {
					if next, _, ok := algorithms.Settle(st, fresh, s.Limit, s.Now, s.Cost, s.Settled, s.At); ok {
						st, fresh = next, false
					}
					d, _, _ := algorithms.Step(st, fresh, s.Limit, s.Now, 0)
					if got := vectortest.Got(d); got != s.Want {
						t.Fatalf("step %d (settle at %d of cost %d to %d; %s): the key's view after it:\n got  %+v\n want %+v", i, s.Step.AtMs, s.Cost, s.Settled, s.Step.Note, got, s.Want)
					}
					continue
				}
				if s.Refund {
					if next, _, ok := algorithms.GiveBack(st, fresh, s.Limit, s.Now, s.Cost, s.At); ok {
						st, fresh = next, false
					}
					d, _, _ := algorithms.Step(st, fresh, s.Limit, s.Now, 0)
					if got := vectortest.Got(d); got != s.Want {
						t.Fatalf("step %d (refund at %d of cost %d charged at %d; %s): the key's view after it:\n got  %+v\n want %+v", i, s.Step.AtMs, s.Cost, s.At, s.Step.Note, got, s.Want)
					}
					continue
				}
				d, next, fullAt := algorithms.StepRequest(st, fresh, s.Request(), s.Now)
				if got := vectortest.Got(d); got != s.Want {
					t.Fatalf("step %d (at %d, cost %d; %s):\n got  %+v\n want %+v", i, s.Step.AtMs, s.Cost, s.Step.Note, got, s.Want)
				}
				if d.Limit != s.Limit.Capacity() {
					t.Fatalf("step %d: Limit %d, want %d", i, d.Limit, s.Limit.Capacity())
				}
				if fullAt-s.Now != s.Want.ResetAfterMs {
					t.Fatalf("step %d: fullAt = now%+d, ResetAfter %dms", i, fullAt-s.Now, s.Want.ResetAfterMs)
				}
				if d.Allowed || algorithms.StartsPenalty(st, fresh, next) {
					st, fresh = next, false
				}
			}
		})
	}
}
