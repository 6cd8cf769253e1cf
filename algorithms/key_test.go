package algorithms

import "testing"

// The text form of each kind of key (what store keys and logs show): the
// kind, the candidate, '-', the payload in hex (4 bytes for IPv4, none for
// the empty bucket). Package identity's tests check it on derived tokens,
// and redisstore's that store keys carry it.
func TestKeyText(t *testing.T) {
	key := func(cand byte, kind KeyKind, payload ...byte) Key {
		k := Key{cand, byte(kind)}
		copy(k[2:], payload)
		return k
	}
	full := []byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0xfe, 0xff}
	for _, tc := range []struct {
		k    Key
		want string
	}{
		{key(0, KeyEmpty), "e0-"},
		{key(1, KeyIPv4, 192, 0, 2, 1, 0xff), "41-c0000201"},
		{key(2, KeyIPv6, full...), "62-20010db800010203040506070809feff"},
		{key(16, KeyHash, full...), "h16-20010db800010203040506070809feff"},
		{key(0, KeyScoped, full...), "s0-20010db800010203040506070809feff"},
	} {
		if got := tc.k.String(); got != tc.want {
			t.Errorf("%v: String %q, want %q", tc.k, got, tc.want)
		}
		if got := string(tc.k.AppendText([]byte("x:"))); got != "x:"+tc.want {
			t.Errorf("%v: AppendText %q, want %q", tc.k, got, "x:"+tc.want)
		}
		if tc.k.Kind() != KeyKind(tc.k[1]) || tc.k.Candidate() != int(tc.k[0]) {
			t.Errorf("%v: kind %q candidate %d", tc.k, tc.k.Kind(), tc.k.Candidate())
		}
	}
	var b [2*KeySize + 8]byte
	k := key(3, KeyHash, full...)
	if n := testing.AllocsPerRun(100, func() { _ = k.AppendText(b[:0]) }); n != 0 {
		t.Errorf("AppendText allocates %v times", n)
	}
}
