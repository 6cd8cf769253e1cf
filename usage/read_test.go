package usage

import (
	"strconv"
	"strings"
	"testing"
)

// readAll reads body, in pieces of n bytes, as a settle zone reads a
// response's (json or events), and returns what it concluded.
func readAll(path []string, events bool, body string, n int) (found, bad bool, value int64) {
	kind := JSON
	if events {
		kind = Events
	}
	return readPaths([][]string{path}, kind, body, n)
}

// readPaths reads body as a settle zone summing paths reads a response of
// the kind given.
func readPaths(paths [][]string, kind Kind, body string, n int) (found, bad bool, value int64) {
	terms := make([]int, len(paths))
	for i := range terms {
		terms[i] = i
	}
	return readTerms(paths, terms, 0, kind, body, n)
}

// readTerms is readPaths with alternatives: terms[i] is paths[i]'s term;
// optional the terms that may be absent.
func readTerms(paths [][]string, terms []int, optional uint8, kind Kind, body string, n int) (found, bad bool, value int64) {
	spec := &Spec{Optional: optional}
	for i, p := range paths {
		spec.Paths = append(spec.Paths, p)
		spec.Term = append(spec.Term, uint8(terms[i]))
		spec.Terms = terms[i] + 1
	}
	var r Reader
	r.Reset(spec)
	r.Start(kind)
	for i := 0; i < len(body); i += n {
		r.Feed([]byte(body[i:min(i+n, len(body))]))
	}
	value, found, bad = r.Result()
	return found, bad, value
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
		{"exponent", `{"usage":{"total_tokens":3e2}}`, true, false, 300},
		{"exponent, capital and signed", `{"usage":{"total_tokens":1E+2}}`, true, false, 100},
		{"fraction made whole", `{"usage":{"total_tokens":1.5E2}}`, true, false, 150},
		{"trailing zeros", `{"usage":{"total_tokens":100.000}}`, true, false, 100},
		{"negative exponent, whole", `{"usage":{"total_tokens":1200e-2}}`, true, false, 12},
		{"negative exponent, not whole", `{"usage":{"total_tokens":1201e-2}}`, false, true, 0},
		{"exponent above 2^53", `{"usage":{"total_tokens":1e16}}`, false, true, 0},
		{"zero exponent", `{"usage":{"total_tokens":0e999999999}}`, true, false, 0},
		{"leading zeros", `{"usage":{"total_tokens":0040}}`, false, true, 0},
		{"leading zeros elsewhere", `{"a":007,"usage":{"total_tokens":40}}`, false, false, 0},
		{"cut exponent", `{"usage":{"total_tokens":1e}}`, false, true, 0},
		{"cut fraction", `{"usage":{"total_tokens":1.}}`, false, true, 0},
		{"two signs", `{"usage":{"total_tokens":1e+-2}}`, false, true, 0},
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
		{"text after the data's JSON", chunk(`{"total_tokens":5}`) + "data: {\"usage\":{\"total_tokens\":9}} x\n\n", true, false, 5},
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
	var r Reader
	r.Reset(&Spec{Paths: [][]string{usagePath}, Term: []uint8{0}, Terms: 1})
	r.Start(Events)
	if n := testing.AllocsPerRun(100, func() { r.Feed(body) }); n != 0 {
		t.Fatalf("%v allocations per event, want 0", n)
	}
}

// TestSettleNumbers: the JSON number grammar (RFC 8259) at the path: 0040 is not JSON, 1E2 is the whole number 100.
func TestSettleNumbers(t *testing.T) {
	for _, c := range []struct {
		num   string
		found bool
		value int64
	}{
		{"0", true, 0}, {"7", true, 7}, {"10", true, 10}, {"0.0", true, 0}, {"1E2", true, 100},
		{"2.50e1", true, 25}, {"9007199254740992", true, 1 << 53}, {"9.007199254740992e15", true, 1 << 53},
		{"00", false, 0}, {"01", false, 0}, {"-0", false, 0}, {"0.5", false, 0}, {".5", false, 0},
		{"1.e2", false, 0}, {"1e", false, 0}, {"+1", false, 0}, {"1-", false, 0}, {"1..2", false, 0},
	} {
		body := `{"n":` + c.num + `}`
		found, _, v := readAll([]string{"n"}, false, body, 1)
		if found != c.found || v != c.value {
			t.Errorf("%s: found %v value %d, want %v %d", body, found, v, c.found, c.value)
		}
	}
}

// anthropicPaths are `settle json usage.input_tokens|message.usage.input_tokens
// usage.output_tokens`: two terms, the first with two alternatives.
var (
	anthropicPaths = [][]string{{"usage", "input_tokens"}, {"message", "usage", "input_tokens"}, {"usage", "output_tokens"}}
	anthropicTerms = []int{0, 0, 1}
)

// anthropicStream is a Messages stream as Anthropic sends it (event:
// lines, data: JSON, a ping, message_start's usage with input_tokens and
// output_tokens 1, message_delta's cumulative output_tokens).
func anthropicStream(input, output int) string {
	return "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-test\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":" + itoa(input) + ",\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":" + itoa(output) + "}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestSettleSum: several paths summed, each path's last value across the
// events or lines winning (Anthropic's input_tokens in message_start,
// output_tokens in message_delta; Ollama's last line); a path never told
// is no amount unless it is optional (term?), an unusable one spoils the
// sum.
func TestSettleSum(t *testing.T) {
	ollama := [][]string{{"prompt_eval_count"}, {"eval_count"}}
	for _, c := range []struct {
		name       string
		paths      [][]string
		kind       Kind
		body       string
		found, bad bool
		value      int64
	}{
		{"anthropic stream", anthropicPaths, Events, anthropicStream(25, 300), true, false, 325},
		{"anthropic stream, message_start only", anthropicPaths, Events, anthropicStream(25, 300)[:strings.Index(anthropicStream(25, 300), "event: content_block_start")], false, false, 0},
		{"anthropic stream, an error event after message_start", anthropicPaths, Events, anthropicStream(25, 300)[:strings.Index(anthropicStream(25, 300), "event: content_block_start")] + "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n", false, false, 0},
		{"anthropic stream, message_delta with input_tokens too", anthropicPaths, Events, strings.Replace(anthropicStream(25, 300), `"usage":{"output_tokens"`, `"usage":{"input_tokens":25,"output_tokens"`, 1), true, false, 325},
		{"anthropic json", anthropicPaths, JSON, `{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":25,"output_tokens":300}}`, true, false, 325},
		{"alternatives: the first told wins", anthropicPaths, JSON, `{"usage":{"input_tokens":25,"output_tokens":3},"message":{"usage":{"input_tokens":99}}}`, true, false, 28},
		{"alternatives: an unusable one, another told", anthropicPaths, JSON, `{"usage":{"input_tokens":"x","output_tokens":3},"message":{"usage":{"input_tokens":7}}}`, true, false, 10},
		{"one term told", anthropicPaths, JSON, `{"usage":{"output_tokens":300}}`, false, false, 0},
		{"none told", anthropicPaths, JSON, `{"usage":{}}`, false, false, 0},
		{"one unusable", anthropicPaths, JSON, `{"usage":{"input_tokens":25,"output_tokens":-1}}`, false, true, 25},
		{"sum above 2^53", anthropicPaths, JSON, `{"usage":{"input_tokens":9007199254740992,"output_tokens":1}}`, false, true, 1<<53 + 1},
		{"ollama ndjson", ollama, Lines, "{\"model\":\"llama3\",\"message\":{\"role\":\"assistant\",\"content\":\"He\"},\"done\":false}\n{\"model\":\"llama3\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"total_duration\":5,\"prompt_eval_count\":26,\"eval_count\":290}\n", true, false, 316},
		{"ndjson, crlf, last line unterminated", ollama, Lines, "{\"done\":false}\r\n{\"done\":true,\"prompt_eval_count\":1,\"eval_count\":2}", true, false, 3},
		{"ndjson, last line cut", ollama, Lines, "{\"prompt_eval_count\":1,\"eval_count\":2}\n{\"prompt_eval_count\":50,\"eval_count\":60", true, false, 3},
		{"ndjson, prompt cached (no prompt_eval_count)", ollama, Lines, "{\"done\":true,\"eval_count\":290}\n", true, false, 290},
		{"ndjson, eval_count absent", ollama, Lines, "{\"done\":true,\"prompt_eval_count\":290}\n", false, false, 0},
		{"ndjson, a broken line", ollama, Lines, "{\"eval_count\":5}\nnot json\n", true, false, 5},
		{"ndjson, text after a line's JSON", ollama, Lines, "{\"eval_count\":5}\n{\"eval_count\":9} x\n", true, false, 5},
	} {
		for _, n := range []int{1, 5, 1 << 20} {
			terms, optional := []int{0, 1}, uint8(1) // prompt_eval_count? eval_count
			if len(c.paths) == len(anthropicPaths) {
				terms, optional = anthropicTerms, 0
			}
			found, bad, v := readTerms(c.paths, terms, optional, c.kind, c.body, n)
			if found != c.found || bad != c.bad || (found || bad) && v != c.value {
				t.Errorf("%s (pieces of %d): found %v bad %v value %d, want %v %v %d", c.name, n, found, bad, v, c.found, c.bad, c.value)
			}
		}
	}
}

// TestSettleSumAllocs: reading an Anthropic stream summing two paths, and
// an NDJSON stream, allocates nothing.
func TestSettleSumAllocs(t *testing.T) {
	body := []byte(anthropicStream(25, 300))
	var r Reader
	r.Reset(&Spec{Paths: anthropicPaths, Term: []uint8{0, 0, 1}, Terms: 2})
	r.Start(Events)
	if n := testing.AllocsPerRun(100, func() { r.Feed(body) }); n != 0 {
		t.Fatalf("%v allocations per Anthropic stream, want 0", n)
	}
	lines := []byte("{\"done\":true,\"prompt_eval_count\":26,\"eval_count\":290}\n")
	r.Reset(&Spec{Paths: [][]string{{"prompt_eval_count"}, {"eval_count"}}, Term: []uint8{0, 1}, Terms: 2})
	r.Start(Lines)
	if n := testing.AllocsPerRun(100, func() { r.Feed(lines) }); n != 0 {
		t.Fatalf("%v allocations per NDJSON line, want 0", n)
	}
}

// TestEventStream: the Content-Types taken for a stream.
func TestEventStream(t *testing.T) {
	for ct, want := range map[string]bool{"text/event-stream": true, "Text/Event-Stream; charset=utf-8": true,
		"text/plain": false, "": false, "text/event-streamx": false} {
		if EventStream(ct) != want {
			t.Errorf("EventStream(%q) = %v, want %v", ct, !want, want)
		}
	}
}
