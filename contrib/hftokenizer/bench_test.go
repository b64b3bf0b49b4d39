package hftokenizer

import (
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the processor time the process has used, user and system: on
// a host whose cores are shared, a benchmark's own cost, where wall time
// includes the time others held the core. Run the benchmarks with -cpu 1
// (GOMAXPROCS=1) for one core's figure.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchText is a mixed text: prose, code, numbers and other scripts.
func benchText() string {
	var b strings.Builder
	parts := []string{
		"The quick brown fox jumps over the lazy dog, and it's not the first time they've met. ",
		"func main() {\n\tfmt.Println(\"hello, world\", 12345, 3.14159)\n}\n",
		"日本語のテキストと中文文本测试，한국어 텍스트도 있습니다. ",
		"Numbers: 1,000,000 and 2026-12-06T04:27:13Z; emoji 👍🏽 and 👨‍👩‍👧‍👦.\n\n",
		"Привет, мир! Ελληνικά κείμενα. العربية نص. ",
	}
	for i := 0; b.Len() < 1<<20; i++ {
		b.WriteString(parts[i%len(parts)])
		b.WriteString(strings.Repeat("x", i%7)) // words the cache has not seen
		b.WriteString(" ")
	}
	return b.String()
}

// BenchmarkEncode reports tokens per second of one goroutine over 1 MiB of
// mixed text, per model, by wall time (tokens/s) and by the process's
// processor time (tokens/cpu-s, garbage collection included).
func BenchmarkEncode(b *testing.B) {
	text := benchText()
	for _, name := range goldenModels {
		tok := models(b)[name]
		b.Run(name, func(b *testing.B) {
			n := 0
			b.SetBytes(int64(len(text)))
			runtime.GC()
			cpu := cpuTime()
			for b.Loop() {
				n += len(tok.Encode(text, false))
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tokens/s")
			b.ReportMetric(float64(n)/(cpuTime()-cpu).Seconds(), "tokens/cpu-s")
		})
	}
}

// longInputs are 60,000-character inputs that stress the pre-tokenizer and
// the merge: long runs of one character, of whitespace, of digits, one
// word without a break.
func longInputs() map[string]string {
	const n = 60000
	return map[string]string{
		"letters":     strings.Repeat("a", n),
		"spaces":      strings.Repeat(" ", n),
		"newlines":    strings.Repeat("\n", n),
		"space-nl":    strings.Repeat(" \n", n/2),
		"digits":      strings.Repeat("7", n),
		"cjk":         strings.Repeat("日", n),
		"emoji":       strings.Repeat("😀", n),
		"word":        strings.Repeat("abcdefghij", n/10),
		"punctuation": strings.Repeat("!?", n/2),
		"apostrophes": strings.Repeat("'s", n/2),
		"mixed":       benchText()[:n],
		"combining":   strings.Repeat("e\u0301", n/2),
		"specials":    strings.Repeat("<|im_end|>", n/10),
	}
}

// BenchmarkEncodeLong reports the worst time of any 60,000-character input,
// by wall time and by the process's processor time.
func BenchmarkEncodeLong(b *testing.B) {
	for _, name := range goldenModels {
		tok := models(b)[name]
		b.Run(name, func(b *testing.B) {
			var worst, worstCPU time.Duration
			inputs := longInputs()
			runtime.GC()
			for b.Loop() {
				for _, s := range inputs {
					start, cpu := time.Now(), cpuTime()
					tok.Encode(s, false)
					worst = max(worst, time.Since(start))
					worstCPU = max(worstCPU, cpuTime()-cpu)
				}
			}
			b.ReportMetric(float64(worst.Microseconds())/1000, "worst-ms")
			b.ReportMetric(float64(worstCPU.Microseconds())/1000, "worst-cpu-ms")
		})
	}
}
