package redisstore

import (
	"strconv"
	"strings"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// The stored-value codec: the values the Lua twins store in Redis
// (lua/common.lua and each algorithm's file), read as the State the Go twin
// would hold. The admin API peeks a key through it (algorithms.Peek at
// Redis's time, without running the script), and the deny cache gets a
// refusal's states through it (Store.remember).

// DecodeState parses a state as the Lua twin stores it (see lua/*.lua). The
// token bucket, gcra, sliding and fixed window are stored in a binary form
// (see encodeState), or in a text form for an instant outside its range:
//
//	token bucket    "<debt>:<at>:<scale>"
//	gcra            "g<at>:<fraction>:<unit>"
//	fixed window    "f<count>:<start>:<length>"
//	sliding window  "s<prev>:<cur>:<start>:<window>"
//	sliding log     "l<base>" then ",<t-base>" or ",<t-base>*<cost>" per event
//
// The sliding log is always stored in text. Any of them may be prefixed by
// a penalty (see decodePenalized). The State DecodeState returns
// carries the algorithm that wrote it, so Step treats it as no state when
// the zone's algorithm has changed since, as the script does. ok is false
// for a value in none of these forms, which the script also counts as no
// state.
func DecodeState(raw string) (st algorithms.State, ok bool) {
	if raw == "" {
		return algorithms.State{}, false
	}
	switch raw[0] {
	case 'g':
		var f [3]int64
		if !decodeFields(raw[1:], f[:], "-++") {
			return algorithms.State{}, false
		}
		return algorithms.State{Alg: algorithms.GCRA, At: f[0], Debt: f[1], Scale: f[2]}, true
	case 'f':
		var f [3]int64
		if !decodeFields(raw[1:], f[:], "+-+") {
			return algorithms.State{}, false
		}
		return algorithms.State{Alg: algorithms.FixedWindow, Debt: f[0], At: f[1], Scale: f[2]}, true
	case 's':
		var f [4]int64
		if !decodeFields(raw[1:], f[:], "++-+") {
			return algorithms.State{}, false
		}
		return algorithms.State{Alg: algorithms.SlidingWindow, Prev: f[0], Debt: f[1], At: f[2], Scale: f[3]}, true
	case 'l':
		return decodeLog(raw[1:])
	case 'p':
		return decodePenalized(raw)
	}
	if raw[0] >= 0x80 {
		return decodeBinary(raw)
	}
	var f [3]int64
	if !decodeFields(raw, f[:], "--+") {
		return algorithms.State{}, false
	}
	return algorithms.State{Alg: algorithms.TokenBucket, Debt: f[0], At: f[1], Scale: f[2]}, true
}

// The binary form of the constant-size states (lua/common.lua documents
// it): a header byte (and, for the sliding window, a length byte), the
// state's instant in 5 bytes, one or two counts and a last field.
const (
	// binEpoch is the instant 0 of the binary form (Unix ms,
	// 2020-09-13T12:26:40Z); it holds instants up to binEpoch + 2^40 ms
	// (in 2055).
	binEpoch = 1_600_000_000_000
	binSpan  = 1 << 40
	// binExact bounds every field: all are exact in Lua's doubles.
	binExact = 1 << 53
)

// binUnits are the units the last field may be stored in: it is stored
// divided by the largest that divides it (1 hour, 1 minute, 1 second).
var binUnits = [4]int64{1, 1000, 60_000, 3_600_000}

// decodeBinary parses the binary form; raw[0] >= 0x80.
func decodeBinary(raw string) (algorithms.State, bool) {
	h := raw[0] - 0x80
	alg := algorithms.Algorithm(h >> 5)
	unit, n1 := binUnits[h&3], int(h>>2&7)
	p, n2 := 1, 0 // p: the instant's first byte
	if alg == algorithms.SlidingWindow {
		if len(raw) < 2 || raw[1] > 7 {
			return algorithms.State{}, false
		}
		p, n2 = 2, int(raw[1])
	}
	e1 := p + 5 + n1
	e2 := e1 + n2
	if rest := len(raw) - e2; rest < 1 || rest > 7 {
		return algorithms.State{}, false
	}
	at := binEpoch + bigEndian(raw[p:p+5])
	f1, f2, m := bigEndian(raw[p+5:e1]), bigEndian(raw[e1:e2]), bigEndian(raw[e2:])
	if f1 >= binExact || f2 >= binExact || m > (binExact-1)/unit {
		return algorithms.State{}, false
	}
	last := m * unit
	switch alg {
	case algorithms.TokenBucket:
		return algorithms.State{Alg: algorithms.TokenBucket, Debt: f1, At: at, Scale: last}, true
	case algorithms.GCRA:
		return algorithms.State{Alg: algorithms.GCRA, At: at, Debt: f1, Scale: last}, true
	case algorithms.SlidingWindow:
		return algorithms.State{Alg: algorithms.SlidingWindow, Prev: f1, Debt: f2, At: at, Scale: last}, true
	default: // FixedWindow: h>>5 is at most 3
		return algorithms.State{Alg: algorithms.FixedWindow, Debt: f1, At: at, Scale: last}, true
	}
}

// bigEndian returns the big-endian unsigned integer of at most 7 bytes.
func bigEndian(b string) int64 {
	var v int64
	for i := 0; i < len(b); i++ {
		v = v<<8 | int64(b[i])
	}
	return v
}

// decodeFields parses len(out) ':'-separated integers; signs[i] is '-' when
// field i may be negative (the Lua pattern's %-?%d+), '+' when not (%d+).
func decodeFields(s string, out []int64, signs string) bool {
	for i := range out {
		field := s
		if i < len(out)-1 {
			end := strings.IndexByte(s, ':')
			if end < 0 {
				return false
			}
			field, s = s[:end], s[end+1:]
		}
		n, ok := parseInt(field, signs[i] == '-')
		if !ok {
			return false
		}
		out[i] = n
	}
	return true
}

// decodeLog parses a sliding log's "<base>" then ",<d>" or ",<d>*<cost>"
// per event (the part after its 'l').
func decodeLog(s string) (algorithms.State, bool) {
	end := strings.IndexByte(s, ',')
	if end < 0 {
		end = len(s)
	}
	base, ok := parseInt(s[:end], true)
	if !ok {
		return algorithms.State{}, false
	}
	s = s[end:]
	lg := &algorithms.Log{Entries: make([]algorithms.LogEntry, 0, strings.Count(s, ","))}
	for s != "" {
		s = s[1:] // the ','
		item := s
		if next := strings.IndexByte(s, ','); next >= 0 {
			item, s = s[:next], s[next:]
		} else {
			s = ""
		}
		off, cost := item, "1"
		if star := strings.IndexByte(item, '*'); star >= 0 {
			off, cost = item[:star], item[star+1:]
		}
		d, ok1 := parseInt(off, false)
		c, ok2 := parseInt(cost, false)
		if !ok1 || !ok2 || c < 1 {
			return algorithms.State{}, false
		}
		lg.Entries = append(lg.Entries, algorithms.LogEntry{At: base + d, Cost: c})
	}
	return algorithms.State{Alg: algorithms.SlidingLog, Log: lg}, true
}

// parseInt parses an optional '-' (when neg) and at least one decimal digit,
// nothing else (strconv alone would accept a '+').
func parseInt(s string, neg bool) (int64, bool) {
	digits := s
	if neg && strings.HasPrefix(s, "-") {
		digits = s[1:]
	}
	if digits == "" {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}
