package redisstore

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// TestLuaLayoutMatchesGo: every constant the Lua sources name in capitals
// (local NAME, ... = value, ...) is the Go definition of that number (or
// separator) of the script's layout, each Go definition is named in
// take.lua, and take.lua compares no mode, and indexes no argument or
// reply, by a bare number.
func TestLuaLayoutMatchesGo(t *testing.T) {
	str := func(v string) string { return "'" + v + "'" }
	num := func(n int) string { return strconv.Itoa(n) }
	want := map[string]string{
		"SEP": str(string(argSep)), "REPLY": num(replyPerZone),
		"MODE_TAKE": str(modeTake), "MODE_REFUND": str(modeRefund), "MODE_REPORT_ONLY": str(modeReportOnly),
		"MODE_REFUNDABLE": str(modeRefundable), "MODE_REPORT_ONLY_REFUNDABLE": str(modeReportOnlyRefundable),
		"MODE_RENEW": str(modeRenew), "MODE_INFLIGHT": str(modeInFlight), "MODE_REPORT_ONLY_INFLIGHT": str(modeReportOnlyInFlight),
		"MODE_REFUND_INFLIGHT": str(modeRefundInFlight), "MODE_SETTLE_INFLIGHT": str(modeSettleInFlight),
		"MODE_SETTLE": str(modeSettle), "UNKNOWN_INSTANT": str(unknownInstant),
		"ALG_CONCURRENCY": strconv.Itoa(int(algorithms.Concurrency)),
		"MAXOCAP":         strconv.FormatInt(algorithms.MaxOverrideCapacity, 10),
		"OVFMT":           "'>c1I7I7I7I7'", "OVLEN": num(overrideLen),
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
		regexp.MustCompile(`mode [~=]= '`),               // a mode by its digit
		regexp.MustCompile(`(alg|\]\[1\]) [~=]= '?\d\b`), // an algorithm id by its digit
		regexp.MustCompile(`\b\d+ \* \(?i\b`),            // a reply's stride
		regexp.MustCompile(`argv\[[^\]]*\d`),             // an argument's position
	} {
		if loc := bare.FindIndex(take); loc != nil {
			t.Errorf("lua/take.lua, line %d: a bare number of the layout (%s)", 1+strings.Count(string(take[:loc[0]]), "\n"), bare)
		}
	}
}

// TestArgsFields: appendTake, appendRefund and appendRenewal write a
// zone's four fields in take.lua's order (spec, cost or holder id, mode,
// instant), joined by argSep, which no field holds.
func TestArgsFields(t *testing.T) {
	var a argCache
	l := algorithms.Limit{Algorithm: algorithms.TokenBucket, Events: 7, Window: 3000, Burst: 9, Penalty: 60000}
	cl := algorithms.Limit{Algorithm: algorithms.Concurrency, Events: 4, Window: 30000}
	spec, cspec := "0:7:3000:9:p60000", "5:4:30000:"+strconv.FormatInt(cl.Capacity(), 10)+":0"
	const holder = 1<<63 + 5 // past 2^53: it must travel as its digits
	for _, c := range []struct {
		got  []byte
		want []string
	}{
		{a.appendTake(nil, &algorithms.Request{Limit: l, Cost: 3, Refundable: true}, false), []string{spec, "3", modeRefundable, unknownInstant}},
		{a.appendTake(nil, &algorithms.Request{Limit: l, Cost: 3, InFlight: true}, true), []string{spec, "3", modeRefundInFlight, unknownInstant}},
		{a.appendTake(nil, &algorithms.Request{Limit: cl, Cost: 1, Holder: holder}, false), []string{cspec, "9223372036854775813", modeTake, unknownInstant}},
		{a.appendRefund(nil, &algorithms.Refund{Limit: l, Cost: 2, At: 12345}), []string{spec, "2", modeRefund, "12345"}},
		{a.appendRefund(nil, &algorithms.Refund{Limit: l, Cost: 2, At: 12345, Keep: true}), []string{spec, "2", modeSettleInFlight, "12345"}},
		{a.appendRefund(nil, &algorithms.Refund{Limit: l, Cost: 2, At: 12345, Settle: true, Settled: 1}), []string{spec, "2", modeSettle, "12345:1"}},
		{a.appendRenewal(nil, &algorithms.Request{Limit: cl, Holder: holder}), []string{cspec, "9223372036854775813", modeRenew, unknownInstant}},
	} {
		if got := strings.Split(string(c.got), string(argSep)); !slices.Equal(got, c.want) {
			t.Errorf("argument %q: fields %q, want %q", c.got, got, c.want)
		}
	}
}

// scriptValues returns the script's reply as an array: a packed
// admission (lua/take.lua) as its integers, an array as it is.
func scriptValues(cmd *redis.Cmd) ([]any, error) {
	v, err := cmd.Result()
	if err != nil {
		return nil, err
	}
	switch v := v.(type) {
	case []any:
		return v, nil
	case int64:
		n, ok := packedAdmission(v)
		if !ok {
			return nil, fmt.Errorf("the script's admission %d is not one zone's", v)
		}
		return []any{n[0], n[1], n[2], n[3]}, nil
	}
	return nil, fmt.Errorf("the script returned %T", v)
}

// TestDecodeAdmission: an admission's array is read with Redis's time at
// its end, a packed one-zone admission as the array of its numbers, from
// go-redis's raw bytes and from a typed command's reply written back; a
// reply of the wrong length or form is refused.
func TestDecodeAdmission(t *testing.T) {
	l := algorithms.Limit{Algorithm: algorithms.TokenBucket, Events: 7, Window: 3000, Burst: 9}
	reqs := []algorithms.Request{{Limit: l, Cost: 1}, {Limit: l, Cost: 1}}
	array := []any{int64(1), int64(8), int64(0), int64(428), int64(1), int64(2), int64(-3), int64(86400000000), int64(1800000000123)}
	want := make([]algorithms.Decision, 2)
	if err := decodeRaw(appendRESP(nil, array), reqs, want, false, nil); err != nil {
		t.Fatal(err)
	}
	if want[1].ResetAfter != 86400000000*time.Millisecond || want[0].At != 1800000000123 || !want[0].Allowed {
		t.Fatalf("the array's decisions: %+v", want)
	}
	want[0].At = 0
	packed := int64(8<<16+428) << 2
	for _, b := range [][]byte{[]byte(":" + strconv.FormatInt(packed, 10) + "\r\n"), appendRESP(nil, packed)} {
		got := make([]algorithms.Decision, 1)
		if err := decodeRaw(b, reqs[:1], got, false, nil); err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		if fmt.Sprint(got[0]) != fmt.Sprint(want[0]) {
			t.Fatalf("%q:\n got %+v\nwant %+v", b, got[0], want[0])
		}
	}
	for _, bad := range [][]byte{appendRESP(nil, array[:3]), appendRESP(nil, append(array, int64(4))), []byte("+1 8 0 428 1 2 -3 86400000000\r\n"), appendRESP(nil, packed)} {
		if err := decodeRaw(bad, reqs, make([]algorithms.Decision, 2), false, nil); err == nil {
			t.Errorf("%q: read without an error", bad)
		}
	}
}
