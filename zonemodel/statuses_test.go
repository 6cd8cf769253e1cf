package zonemodel

import "testing"

func TestParseStatuses(t *testing.T) {
	s, err := ParseStatuses("count", []string{"401", "403", "5xx", "420-429", "1XX"})
	if err != nil {
		t.Fatal(err)
	}
	for code, want := range map[int]bool{401: true, 403: true, 402: false, 500: true, 599: true, 499: false,
		420: true, 425: true, 429: true, 430: false, 419: false, 100: true, 199: true, 200: false, 0: false, 700: false, -1: false} {
		if got := s.Has(code); got != want {
			t.Errorf("Has(%d) = %v, want %v", code, got, want)
		}
	}
	for _, bad := range []string{"40", "4011", "600", "099", "6xx", "0xx", "4x", "abc", "429-420", "400-600", "-", ""} {
		if _, err := ParseStatuses("count", []string{bad}); err == nil {
			t.Errorf("ParseStatuses(%q): no error", bad)
		}
	}
}
