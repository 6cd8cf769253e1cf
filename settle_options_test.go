package sluice

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestSettleOptionChecks: several json paths (summed terms, a|b
// alternatives) and settle's block of options (free) are checked at load,
// the error naming the zone, the field and the Caddyfile's line; the
// existing one-source forms load unchanged.
func TestSettleOptionChecks(t *testing.T) {
	zone := func(extra string) string {
		return site("", "\t\tzone t {\n\t\t\tevents 1000\n\t\t\twindow 1m\n"+extra+"\t\t}")
	}
	for _, c := range []struct {
		name, caddyfile string
		want            []string // nil: loads
	}{
		{"sum", zone("\t\t\tsettle json prompt_eval_count eval_count\n"), nil},
		{"optional term", zone("\t\t\tsettle json prompt_eval_count? eval_count\n"), nil},
		{"? inside a term", zone("\t\t\tsettle json a?|b c\n"), []string{`zone "t"`, "settle", "a ? ends a term"}},
		{"alternatives", zone("\t\t\tsettle json usage.input_tokens|message.usage.input_tokens usage.output_tokens\n"), nil},
		{"free", zone("\t\t\tsettle json usage.total_tokens {\n\t\t\t\tfree 5xx 429 408\n\t\t\t}\n"), nil},
		{"free none", zone("\t\t\tsettle header X-Usage {\n\t\t\t\tfree none\n\t\t\t}\n"), nil},
		{"free empty", zone("\t\t\tsettle json n {\n\t\t\t\tfree\n\t\t\t}\n"), []string{`zone "t"`, "settle: free needs", "Caddyfile:"}},
		{"free not a status", zone("\t\t\tsettle json n {\n\t\t\t\tfree 6xx\n\t\t\t}\n"), []string{`zone "t"`, "settle: free", `"6xx"`, "Caddyfile:"}},
		{"free none and more", zone("\t\t\tsettle json n {\n\t\t\t\tfree none 5xx\n\t\t\t}\n"), []string{`zone "t"`, "settle: free", `"none"`}},
		{"unknown option", zone("\t\t\tsettle json n {\n\t\t\t\tfree_all\n\t\t\t}\n"), []string{`zone "t"`, "settle: unknown option", "free_all", "Caddyfile:"}},
		{"duplicate option", zone("\t\t\tsettle json n {\n\t\t\t\tfree 5xx\n\t\t\t\tfree 429\n\t\t\t}\n"), []string{`zone "t"`, "settle: duplicate free"}},
		{"too many terms", zone("\t\t\tsettle json a b c d e\n"), []string{`zone "t"`, "settle", "more than 4 terms"}},
		{"too many paths", zone("\t\t\tsettle json a|b|c b1|b2|b3 c1|c2|c3\n"), []string{`zone "t"`, "settle", "more than 8 paths"}},
		{"empty alternative", zone("\t\t\tsettle json a||b\n"), []string{`zone "t"`, "settle", "empty alternative"}},
		{"trailing bar", zone("\t\t\tsettle json a| b\n"), []string{`zone "t"`, "settle", "empty alternative"}},
		{"path twice", zone("\t\t\tsettle json a a|b\n"), []string{`zone "t"`, "settle", `"a" is read twice`}},
		{"header with paths", zone("\t\t\tsettle header X-A X-B\n"), []string{`zone "t"`, "settle takes a source"}},
	} {
		t.Run(c.name, func(t *testing.T) { expectConfig(t, c.caddyfile, c.want) })
	}
}

// TestSettleOptionsJSON: the JSON form, {"json": "<path> ...", "free":
// [...]}, loads as the Caddyfile's; a status that is not one is refused,
// naming the zone and the field.
func TestSettleOptionsJSON(t *testing.T) {
	for _, c := range []struct {
		settle, want string // want "": loads
	}{
		{`{"json":"usage.total_tokens"}`, ""},
		{`{"json":"usage.input_tokens|message.usage.input_tokens usage.output_tokens","free":["none"]}`, ""},
		{`{"json":"prompt_eval_count? eval_count","free":["5xx","429","408"]}`, ""},
		{`{"json":"n","free":["7xx"]}`, `settle: free: "7xx" is not a status`},
		{`{"json":"n","free":["none","5xx"]}`, "none stands alone"},
	} {
		js := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"s":{"listen":[":0"],"routes":[{"handle":[{"handler":"rate_limit",` +
			`"rate_limits":{"z":{"max_events":1000,"window":"1m","settle":` + c.settle + `}}}]}]}}}}}`
		var cfg caddy.Config
		if err := json.Unmarshal([]byte(js), &cfg); err != nil {
			t.Fatal(err)
		}
		err := caddy.Validate(&cfg)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.settle, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `"z"`)):
			t.Errorf("%s: error %v, want it to name the zone and say %q", c.settle, err, c.want)
		}
	}
}
