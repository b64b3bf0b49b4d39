// Command cpuhog keeps every core busy: -per-core goroutines per core spin
// until it is stopped (SIGINT, SIGTERM) or -for has passed. It is the
// "other work" beside scripts/busy-test.sh's runs of the test suite.
//
//	go run ./scripts/cpuhog [-per-core 2] [-for 10m]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	perCore := flag.Int("per-core", 2, "busy goroutines per core")
	dur := flag.Duration("for", 0, "stop after this long (0: until stopped)")
	flag.Parse()
	if *perCore < 1 {
		fmt.Fprintln(os.Stderr, "cpuhog: -per-core must be at least 1")
		os.Exit(2)
	}
	var sink atomic.Uint64
	n := *perCore * runtime.NumCPU()
	runtime.GOMAXPROCS(n) // n busy threads: the kernel shares each core between perCore of them and the tests
	for range n {
		go func() {
			x := uint64(1)
			for {
				for range 1 << 20 {
					x = x*6364136223846793005 + 1442695040888963407
				}
				sink.Add(x & 1)
			}
		}()
	}
	fmt.Fprintf(os.Stderr, "cpuhog: %d busy goroutines on %d cores\n", n, runtime.NumCPU())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	var after <-chan time.Time
	if *dur > 0 {
		after = time.After(*dur)
	}
	select {
	case <-stop:
	case <-after:
	}
}
