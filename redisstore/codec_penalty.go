package redisstore

import "github.com/sluicehq/caddy-sluice/algorithms"

// decodePenalized parses a state with a penalty (algorithms/penalty.go), as
// lua/common.lua writes it: 'p', the instant the penalty started (Unix ms)
// in 6 bytes, big-endian, then the algorithm's value in any form above, or
// nothing (the key holds the penalty alone: State with Scale 0 and no Log).
// A value too short to hold the instant is no state, as the script reads
// it.
func decodePenalized(raw string) (algorithms.State, bool) {
	if len(raw) < 7 {
		return algorithms.State{}, false
	}
	var st algorithms.State
	if rest := raw[7:]; rest != "" && rest[0] != 'p' {
		st, _ = DecodeState(rest) // an unreadable rest is no state of the algorithm's, as in the script
	}
	st.Penalized = bigEndian(raw[1:7])
	return st, true
}
