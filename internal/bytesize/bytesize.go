// Package bytesize reads the byte counts that the command-line tools take
// as flags (-capacity, -object-size).
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Parse reads a positive byte count: a decimal integer with an optional
// unit. K, M, G, T, KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, TB
// powers of 1000; B is bytes. Units are case-insensitive and may follow a
// space. Zero, fractions, exponents and counts that overflow a uint64 are
// errors.
func Parse(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("size %q: want a number of bytes, like 4MiB", s)
	}
	n, err := strconv.ParseUint(t[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	var mult uint64
	switch strings.ToLower(strings.TrimSpace(t[i:])) {
	case "", "b":
		mult = 1
	case "k", "kib":
		mult = 1 << 10
	case "m", "mib":
		mult = 1 << 20
	case "g", "gib":
		mult = 1 << 30
	case "t", "tib":
		mult = 1 << 40
	case "kb":
		mult = 1e3
	case "mb":
		mult = 1e6
	case "gb":
		mult = 1e9
	case "tb":
		mult = 1e12
	default:
		return 0, fmt.Errorf("size %q: unknown unit %q", s, t[i:])
	}
	if n > math.MaxUint64/mult {
		return 0, fmt.Errorf("size %q overflows", s)
	}
	if n == 0 {
		return 0, fmt.Errorf("size %q: must not be 0", s)
	}
	return n * mult, nil
}
