package bytesize

import (
	"strconv"
	"testing"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]uint64{
		"1": 1, "4096": 4096, "3b": 3, "7b": 7,
		"4KiB": 4096, "4k": 4096, "2 KiB": 2048, "3KB": 3000,
		"2 MiB": 2 << 20, "512MiB": 512 << 20, "512M": 512 << 20, " 5 mb ": 5e6,
		"4GiB": 4 << 30, "1g": 1 << 30, "1GB": 1e9,
		"1T": 1 << 40, "1TB": 1e12,
	} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{
		"", "x", "GiB", "-1", "1.5G", "1e9", "4 GiBs", "1XB",
		"0", "0GiB", "16777216TiB", "99999999999999999999",
	} {
		if got, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %d, want an error", in, got)
		}
	}
}

// FuzzParse: never panics; an accepted size is positive and round-trips
// through its plain-bytes form.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"4GiB", "512MiB", "1", "17 kb", "18446744073709551615", "16777215TiB", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			return
		}
		if n == 0 {
			t.Fatalf("Parse(%q) = 0", s)
		}
		back, err := Parse(strconv.FormatUint(n, 10))
		if err != nil || back != n {
			t.Fatalf("round trip of %d: %d, %v", n, back, err)
		}
	})
}
