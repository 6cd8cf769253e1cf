package sluice

import (
	"strings"
	"testing"
)

// TestStoreErrorsNameTheStoreOnce: a store's Caddyfile error names the
// store once ("store redis: store redis: ..." was issue 13, item 18), keeps
// its file and line, and the redis store's list of known options names
// pipelines.
func TestStoreErrorsNameTheStoreOnce(t *testing.T) {
	cases := []struct {
		name, block string
		want        []string
	}{
		{"redis unknown option", "\t\tstore redis redis://127.0.0.1:1 {\n\t\t\tpipeline 3\n\t\t}",
			[]string{`store redis: unknown option "pipeline"`, "pipelines", "Caddyfile:"}},
		{"redis without url", "\t\tstore redis {\n\t\t\ttimeout 1s\n\t\t}",
			[]string{"store redis: url or cluster is required"}},
		{"memory unknown option", "\t\tstore memory {\n\t\t\tmax_key 10\n\t\t}",
			[]string{`store memory: unknown option "max_key"`, "max_keys, sweep_interval"}},
		{"unknown store", "\t\tstore mongo",
			[]string{"store mongo: "}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := adapt(t, site("", zoneZ+c.block))
			if err == nil {
				t.Fatalf("adapted without error:\n%s", c.block)
			}
			msg := err.Error()
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
			for _, store := range []string{"store redis:", "store memory:", "store mongo:"} {
				if n := strings.Count(msg, store); n > 1 {
					t.Errorf("error %q names %q %d times", msg, store, n)
				}
			}
		})
	}
}
