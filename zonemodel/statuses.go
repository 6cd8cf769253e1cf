package zonemodel

import (
	"fmt"
	"strconv"
	"strings"
)

// Statuses is a set of HTTP statuses, 100 to 599.
type Statuses [10]uint64

func (s *Statuses) add(code int) { s[code>>6] |= 1 << (code & 63) }

// Has reports whether code is in s.
func (s *Statuses) Has(code int) bool {
	return code >= 0 && code < 640 && s[code>>6]&(1<<(code&63)) != 0
}

func (s *Statuses) addRange(lo, hi int) {
	for c := lo; c <= hi; c++ {
		s.add(c)
	}
}

// ParseStatuses compiles the items of field (`count`, settle's `free`):
// codes (401), classes (4xx) and ranges (500-599), 100 to 599.
func ParseStatuses(field string, items []string) (*Statuses, error) {
	var s Statuses
	code := func(v string) (int, bool) {
		n, err := strconv.Atoi(v)
		return n, err == nil && len(v) == 3 && n >= 100 && n <= 599
	}
	for _, it := range items {
		lower := strings.ToLower(strings.TrimSpace(it))
		if lo, hi, ok := strings.Cut(lower, "-"); ok {
			a, okA := code(lo)
			b, okB := code(hi)
			if !okA || !okB || a > b {
				return nil, fmt.Errorf("%s: %q is not a range of statuses (500-599)", field, it)
			}
			s.addRange(a, b)
			continue
		}
		if len(lower) == 3 && lower[1:] == "xx" && lower[0] >= '1' && lower[0] <= '5' {
			c := int(lower[0]-'0') * 100
			s.addRange(c, c+99)
			continue
		}
		c, ok := code(lower)
		if !ok {
			return nil, fmt.Errorf("%s: %q is not a status: write a code from 100 to 599 (401), a class (4xx) or a range (500-599)", field, it)
		}
		s.add(c)
	}
	return &s, nil
}
