package usage

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestWithUsage: a streamed request that does not ask for usage is
// rewritten to ask for it, every other shape kept byte for byte.
func TestWithUsage(t *testing.T) {
	for _, c := range []struct{ in, out string }{
		{`{"model":"m","stream":true}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{` {"stream": true , "n":1 } `, ` {"stream": true , "n":1 ,"stream_options":{"include_usage":true}} `},
		{`{"stream":true,"stream_options":null}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{}}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{ }}`, `{"stream":true,"stream_options":{"include_usage":true }}`},
		{`{"stream":true,"stream_options":{"include_obfuscation":false}}`, `{"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false}}`},
		{`{"stream":true,"stream_options":{"include_usage":false}}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{"include_usage": null ,"x":"}"}}`, `{"stream":true,"stream_options":{"include_usage": true ,"x":"}"}}`},
		{`{"messages":[{"content":"\"stream\":true}"}],"stream":true}`, `{"messages":[{"content":"\"stream\":true}"}],"stream":true,"stream_options":{"include_usage":true}}`},
	} {
		got, ok := WithUsage([]byte(c.in))
		if !ok || string(got) != c.out {
			t.Errorf("%s: %s %v, want %s", c.in, got, ok, c.out)
		}
	}
	for _, in := range []string{
		`{"model":"m"}`, `{"stream":false}`, `{"stream":"true"}`,
		`{"stream":true,"stream_options":{"include_usage":true}}`, // asked
		`{"str\u0065am":true}`, `{"stream":true,"stream\u005foptions":{"include_usage":false}}`, // escaped keys
		`{"stream":true,"stream_options":"x"}`, `{"stream":true`, `{"stream":true} {}`, `[{"stream":true}]`, ``, `{"stream":true,}`,
	} {
		if got, ok := WithUsage([]byte(in)); ok || string(got) != in {
			t.Errorf("%s: rewritten to %s", in, got)
		}
	}
}

// TestOutputBound reads the largest of the output bounds.
func TestOutputBound(t *testing.T) {
	for in, want := range map[string]int64{
		`{"max_tokens":500}`: 500, `{"max_completion_tokens":70,"max_tokens":60}`: 70, `{"max_output_tokens":9}`: 9,
		`{"messages":[{"max_tokens":900}]}`: 0, `{"max_tokens":"9"}`: 0, `{"max_tokens":-9}`: 0, `{}`: 0, `nope`: 0,
	} {
		if got := OutputBound([]byte(in)); got != want {
			t.Errorf("%s: %d, want %d", in, got, want)
		}
	}
}

// TestUsageStrip: the usage event is dropped from the client's stream,
// however the stream is cut into writes; every other byte passes in
// order; an event longer than maxHeld passes as it comes.
func TestUsageStrip(t *testing.T) {
	chunk := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n"
	usage := "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"total_tokens\":7}}\n\n"
	stream := ": ping\n\n" + chunk + chunk + usage + "data: [DONE]\n\n"
	want := ": ping\n\n" + chunk + chunk + "data: [DONE]\n\n"
	for _, size := range []int{1, 2, 3, 7, 64, len(stream)} {
		var s Strip
		s.Reset()
		var out bytes.Buffer
		for p := stream; p != ""; {
			n := min(size, len(p))
			if err := s.Write(&out, []byte(p[:n])); err != nil {
				t.Fatal(err)
			}
			p = p[n:]
		}
		s.Flush(&out)
		if out.String() != want || s.stripped != 1 {
			t.Errorf("writes of %d: %q (%d stripped), want %q", size, out.String(), s.stripped, want)
		}
	}
	// CRLF lines; an unfinished last event is flushed at the end.
	var s Strip
	s.Reset()
	var out bytes.Buffer
	crlf := strings.ReplaceAll(usage, "\n", "\r\n")
	s.Write(&out, []byte(crlf+"data: tail"))
	s.Flush(&out)
	if out.String() != "data: tail" {
		t.Errorf("CRLF: %q", out.String())
	}
	// Not the usage event: choices not empty, usage null, two data lines.
	for _, ev := range []string{chunk, "data: {\"choices\":[],\"usage\":null}\n\n", "data: {\"choices\":[],\n" + usage, "event: x\n" + usage} {
		if usageEvent([]byte(ev)) {
			t.Errorf("%q read as the usage event", ev)
		}
	}
	big := "data: " + strings.Repeat("x", maxHeld+10) + "\n\n"
	s.Reset()
	out.Reset()
	for p := big + usage; p != ""; p = p[min(1000, len(p)):] {
		s.Write(&out, []byte(p[:min(1000, len(p))]))
	}
	if out.String() != big {
		t.Errorf("an event over maxHeld: %d bytes out, want %d", out.Len(), len(big))
	}
}

// FuzzWithUsage: no input panics the rewrite or the event filter; a
// rewritten JSON object stays JSON, streamed, asking for usage.
//
//	go test -run XXX -fuzz FuzzWithUsage -fuzztime 30s ./usage/
func FuzzWithUsage(f *testing.F) {
	for _, s := range []string{`{"stream":true}`, `{"stream":true,"stream_options":{"include_usage":false,"x":[1,{"y":"}"}]}}`,
		`{"stream":true,"stream_options":null}`, `{"a":"\"","stream":true}`, `{"stream":true,"stream_options":{}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		usageEvent(append([]byte("data: "), in...))
		OutputBound(in)
		out, ok := WithUsage(in)
		if !ok {
			if !bytes.Equal(out, in) {
				t.Fatalf("%q changed to %q without a rewrite", in, out)
			}
			return
		}
		if !json.Valid(in) {
			return // the upstream refuses it either way
		}
		var v struct {
			Stream        bool `json:"stream"`
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.Unmarshal(out, &v); err != nil || !v.Stream || !v.StreamOptions.IncludeUsage {
			t.Fatalf("%s rewritten to %s: %+v %v", in, out, v, err)
		}
	})
}
