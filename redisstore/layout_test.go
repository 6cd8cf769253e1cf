package redisstore

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// TestLuaLayoutMatchesGo: every constant the Lua sources name in capitals
// (local NAME, ... = value, ...) is the Go definition of that number of the
// script's layout, each Go definition is named in take.lua, and take.lua
// compares no mode, and indexes no argument or reply, by a bare number.
func TestLuaLayoutMatchesGo(t *testing.T) {
	str := func(v any) string { return "'" + v.(string) + "'" }
	num := func(n int) string { return strconv.Itoa(n) }
	want := map[string]string{
		"ARGS": num(argsPerZone), "REPLY": num(replyPerZone),
		"A_ALG": num(argAlgorithm), "A_EVENTS": num(argEvents), "A_WINDOW": num(argWindow), "A_CAPACITY": num(argCapacity),
		"A_COST": num(argCost), "A_MODE": num(argMode), "A_OPTS": num(argOptions), "A_AT": num(argInstant),
		"MODE_TAKE": str(modeTake), "MODE_REFUND": str(modeRefund), "MODE_REPORT_ONLY": str(modeReportOnly),
		"MODE_REFUNDABLE": str(modeRefundable), "MODE_REPORT_ONLY_REFUNDABLE": str(modeReportOnlyRefundable),
		"MODE_RENEW": str(modeRenew), "MODE_INFLIGHT": str(modeInFlight), "MODE_REPORT_ONLY_INFLIGHT": str(modeReportOnlyInFlight),
		"MODE_REFUND_INFLIGHT": str(modeRefundInFlight), "MODE_SETTLE_INFLIGHT": str(modeSettleInFlight),
		"MODE_SETTLE":     str(modeSettle),
		"ALG_CONCURRENCY": "'" + strconv.Itoa(int(algorithms.Concurrency)) + "'",
	}
	decl := regexp.MustCompile(`(?m)^local ([A-Z][A-Z0-9_]*(?:, [A-Z][A-Z0-9_]*)*) = (.+)$`)
	files, err := filepath.Glob("lua/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("lua/*.lua: %v", err)
	}
	named := map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			names, values := strings.Split(m[1], ", "), strings.Split(m[2], ", ")
			if len(names) != len(values) {
				t.Errorf("%s: %q: %d names, %d values", f, m[0], len(names), len(values))
				continue
			}
			for i, name := range names {
				w, ok := want[name]
				switch {
				case !ok:
					t.Errorf("%s: %s = %s has no Go definition in this test's table", f, name, values[i])
				case values[i] != w:
					t.Errorf("%s: %s = %s, Go defines %s", f, name, values[i], w)
				}
				if filepath.Base(f) == "take.lua" {
					named[name] = true
				}
			}
		}
	}
	for name := range want {
		if !named[name] {
			t.Errorf("lua/take.lua does not name %s", name)
		}
	}
	take, err := os.ReadFile("lua/take.lua")
	if err != nil {
		t.Fatal(err)
	}
	for _, bare := range []*regexp.Regexp{
		regexp.MustCompile(`mode [~=]= '`),    // a mode by its digit
		regexp.MustCompile(`== '\d'`),         // an algorithm id by its digit
		regexp.MustCompile(`\b\d+ \* \(?i\b`), // an argument's or a reply's stride
		regexp.MustCompile(`\[b \+ \d\]`),     // an argument's position
	} {
		if loc := bare.FindIndex(take); loc != nil {
			t.Errorf("lua/take.lua, line %d: a bare number of the layout (%s)", 1+strings.Count(string(take[:loc[0]]), "\n"), bare)
		}
	}
}

// TestArgsAtTheirPositions: the arguments appendArgs, appendRefunds and
// appendRenewal write stand at the positions the constants name.
func TestArgsAtTheirPositions(t *testing.T) {
	var a argCache
	l := algorithms.Limit{Algorithm: algorithms.TokenBucket, Events: 7, Window: 3000, Burst: 9}
	take := a.appendArgs(nil, []algorithms.Request{{Limit: l, Cost: 3, Refundable: true}}, false)
	refund := a.appendRefunds(nil, []algorithms.Refund{{Limit: l, Cost: 2, At: 12345}})
	renew := a.appendRenewal(nil, &algorithms.Request{Limit: l, Holder: 99})
	for _, args := range [][]any{take, refund, renew} {
		if len(args) != argsPerZone {
			t.Fatalf("%d arguments, argsPerZone %d", len(args), argsPerZone)
		}
	}
	at := func(args []any, pos int) any { return args[pos-1] }
	for _, c := range []struct {
		got, want any
	}{
		{at(take, argAlgorithm), strconv.Itoa(int(algorithms.TokenBucket))},
		{at(take, argEvents), "7"}, {at(take, argWindow), "3000"}, {at(take, argCapacity), "9"},
		{at(take, argCost), int64(3)}, {at(take, argMode), modeRefundable}, {at(take, argOptions), "0"},
		{at(take, argInstant), unknownInstant},
		{at(refund, argCost), int64(2)}, {at(refund, argMode), modeRefund}, {at(refund, argInstant), int64(12345)},
		{at(renew, argMode), modeRenew},
	} {
		if c.got != c.want {
			t.Errorf("argument %v (%T), want %v (%T)", c.got, c.got, c.want, c.want)
		}
	}
}
