package stores_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/memstore"
	"github.com/sluicehq/caddy-sluice/stores"
)

// tracer is a layer that notes its name on the way down and up.
func tracer(name string, trace *[]string) stores.Layer {
	return func(next stores.Store) stores.Store {
		return stores.TakeFunc(func(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
			*trace = append(*trace, name+">")
			err := next.Take(ctx, reqs, out)
			*trace = append(*trace, "<"+name)
			return err
		})
	}
}

// TestStackOrder: the first layer is on top, the store at the bottom
// decides, and the layers see its decision.
func TestStackOrder(t *testing.T) {
	mem := memstore.New(memstore.Config{MaxKeys: 64})
	defer mem.Close()
	var trace []string
	s := stores.Stack(mem, tracer("a", &trace), tracer("b", &trace))
	lim, err := algorithms.NewLimit(algorithms.TokenBucket, 1, time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	req := []algorithms.Request{{Zone: "z", Key: algorithms.Key{1, byte(algorithms.KeyHash), 7}, Limit: lim, Cost: 1}}
	out := make([]algorithms.Decision, 1)
	for i, want := range []bool{true, false} {
		if err := s.Take(context.Background(), req, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed != want {
			t.Fatalf("take %d: allowed %v, want %v (the store below must decide)", i, out[0].Allowed, want)
		}
	}
	if want := []string{"a>", "b>", "<b", "<a", "a>", "b>", "<b", "<a"}; !slices.Equal(trace, want) {
		t.Fatalf("trace %v, want %v", trace, want)
	}
}

// TestStackEmpty: no layers is the store itself.
func TestStackEmpty(t *testing.T) {
	mem := memstore.New(memstore.Config{MaxKeys: 64})
	defer mem.Close()
	if s := stores.Stack(mem); s != stores.Store(mem) {
		t.Fatalf("Stack without layers = %T, want the store", s)
	}
}
