package sluice

import (
	"testing"
)

// readAll reads body, in pieces of n bytes, as a settle zone reads a
// response's (json or events), and returns what it concluded.
func readAll(path []string, events bool, body string, n int) (found, bad bool, value int64) {
	rd := &usageRead{sz: &settleZone{path: path}, body: bodyJSON}
	if events {
		rd.body = bodyEvents
	}
	rd.json.reset(path)
	for i := 0; i < len(body); i += n {
		p := []byte(body[i:min(i+n, len(body))])
		if events {
			rd.sse.feed(rd, p)
		} else {
			rd.json.feed(p)
		}
	}
	rd.result(nil)
	return rd.found, rd.bad, rd.value
}

var usagePath = []string{"usage", "total_tokens"}

// TestSettleJSONBody: the amount at the path of a JSON body, whatever the
// pieces the body arrives in; the unusable ones are told apart from the
// missing ones, and nothing else at another path is taken for it.
func TestSettleJSONBody(t *testing.T) {
	for _, c := range []struct {
		name, body string
		found, bad bool
		value      int64
	}{
		{"openai", `{"id":"x","choices":[{"message":{"content":"usage \"total_tokens\": 9"}}],"usage":{"prompt_tokens":10,"completion_tokens":290,"total_tokens":300}}`, true, false, 300},
		{"zero", `{"usage":{"total_tokens":0}}`, true, false, 0},
		{"spaces", " {\n \"usage\" : { \"total_tokens\" :\t42 } }\n", true, false, 42},
		{"number at the end", `{"usage":{"total_tokens":7`, false, false, 0},
		{"same key elsewhere", `{"a":{"usage":{"total_tokens":5}},"total_tokens":6,"usage":[{"total_tokens":8}]}`, false, false, 0},
		{"deeper key of the same name", `{"usage":{"x":{"total_tokens":5}}}`, false, false, 0},
		{"prefix of a key", `{"usage":{"total_tokens_x":5,"total_token":6}}`, false, false, 0},
		{"escaped key", `{"usage":{"total\u005ftokens":5}}`, false, false, 0},
		{"string", `{"usage":{"total_tokens":"300"}}`, false, true, 0},
		{"negative", `{"usage":{"total_tokens":-3}}`, false, true, 0},
		{"fraction", `{"usage":{"total_tokens":3.5}}`, false, true, 0},
		{"exponent", `{"usage":{"total_tokens":3e2}}`, false, true, 0},
		{"2^53", `{"usage":{"total_tokens":9007199254740992}}`, true, false, 1 << 53},
		{"above 2^53", `{"usage":{"total_tokens":9007199254740993}}`, false, true, 0},
		{"huge", `{"usage":{"total_tokens":123456789012345678901234567890}}`, false, true, 0},
		{"null", `{"usage":{"total_tokens":null}}`, false, true, 0},
		{"object", `{"usage":{"total_tokens":{"n":1}}}`, false, true, 0},
		{"missing", `{"usage":{"prompt_tokens":3}}`, false, false, 0},
		{"not json", `<html>300</html>`, false, false, 0},
		{"empty", ``, false, false, 0},
		{"found, then broken", `{"usage":{"total_tokens":12}} }}}`, true, false, 12},
		{"deep nesting elsewhere", `{"a":` + nest(40) + `,"usage":{"total_tokens":4}}`, true, false, 4},
	} {
		for _, n := range []int{1, 3, 1 << 20} {
			found, bad, v := readAll(usagePath, false, c.body, n)
			if found != c.found || bad != c.bad || v != c.value {
				t.Errorf("%s (pieces of %d): found %v bad %v value %d, want %v %v %d", c.name, n, found, bad, v, c.found, c.bad, c.value)
			}
		}
	}
}

func nest(n int) string {
	s := "1"
	for i := 0; i < n; i++ {
		if i%2 == 0 {
			s = "[" + s + "]"
		} else {
			s = `{"k":` + s + "}"
		}
	}
	return s
}

// TestSettleEventStream: the last complete event carrying the amount wins;
// [DONE], comments, other fields and events without it change nothing; an
// event cut by the stream's end counts for nothing; CRLF and CR lines.
func TestSettleEventStream(t *testing.T) {
	chunk := func(usage string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","choices":[{"delta":{"content":"hi"}}],"usage":` + usage + "}\n\n"
	}
	for _, c := range []struct {
		name, body string
		found, bad bool
		value      int64
	}{
		{"openai", chunk("null") + chunk("null") + chunk(`{"prompt_tokens":1,"total_tokens":300}`) + "data: [DONE]\n\n", true, false, 300},
		{"last wins", chunk(`{"total_tokens":5}`) + chunk(`{"total_tokens":9}`), true, false, 9},
		{"a later event without it keeps it", chunk(`{"total_tokens":5}`) + chunk("null") + ": comment\n\nevent: x\ndata: {}\n\n", true, false, 5},
		{"crlf", "data: {\"usage\":{\"total_tokens\":11}}\r\n\r\n", true, false, 11},
		{"cr", "data: {\"usage\":{\"total_tokens\":12}}\r\r", true, false, 12},
		{"no space, two data lines", "data:{\"usage\":\ndata: {\"total_tokens\":13}}\n\n", true, false, 13},
		{"cut mid-event", chunk(`{"total_tokens":5}`) + `data: {"usage":{"total_tokens":77}}`, true, false, 5},
		{"cut mid-event, nothing before", `data: {"usage":{"total_tokens":77}}` + "\n", false, false, 0},
		{"unusable", chunk(`{"total_tokens":-1}`), false, true, 0},
		{"unusable after a good one", chunk(`{"total_tokens":4}`) + chunk(`{"total_tokens":"x"}`), true, false, 4},
		{"not an event stream", "hello\n\n", false, false, 0},
		{"dataless field", "database: {\"usage\":{\"total_tokens\":1}}\n\n", false, false, 0},
	} {
		for _, n := range []int{1, 2, 7, 1 << 20} {
			found, bad, v := readAll(usagePath, true, c.body, n)
			if found != c.found || bad != c.bad || v != c.value {
				t.Errorf("%s (pieces of %d): found %v bad %v value %d, want %v %v %d", c.name, n, found, bad, v, c.found, c.bad, c.value)
			}
		}
	}
}

// TestSettleReadAllocs: reading a body allocates nothing.
func TestSettleReadAllocs(t *testing.T) {
	body := []byte(`data: {"choices":[{"delta":{"content":"hello"}}],"usage":{"total_tokens":300}}` + "\n\n")
	rd := &usageRead{sz: &settleZone{path: usagePath}, body: bodyEvents}
	rd.json.reset(usagePath)
	if n := testing.AllocsPerRun(100, func() { rd.sse.feed(rd, body) }); n != 0 {
		t.Fatalf("%v allocations per event, want 0", n)
	}
}
