package umbp

import (
	"strconv"
	"testing"
	"time"
)

func TestQuarantineExpires(t *testing.T) {
	now := time.Unix(1000, 0)
	q := newQuarantine(30 * time.Second)
	q.now = func() time.Time { return now }
	q.add([]string{"b", "d"})
	keys := []string{"a", "b", "c", "d"}
	if i := q.first(keys); i != 1 {
		t.Fatalf("first = %d, want 1", i)
	}
	hits := []bool{true, true, true, false}
	if n := q.mask(keys, hits); n != 1 || hits[1] || !hits[0] || !hits[2] {
		t.Fatalf("mask = %d, %v", n, hits)
	}
	now = now.Add(30 * time.Second) // the quarantine is over
	if i := q.first(keys); i != len(keys) {
		t.Fatalf("first after expiry = %d", i)
	}
	if len(q.until) != 0 {
		t.Errorf("expired keys kept: %v", q.until)
	}
	var off *quarantine = newQuarantine(0)
	if off != nil || off.first(keys) != len(keys) || off.mask(keys, hits) != 0 || off.add(keys) != 0 {
		t.Error("a quarantine of 0 is not off")
	}
}

func TestQuarantineBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	q := newQuarantine(time.Second)
	q.now = func() time.Time { return now }
	keys := make([]string, quarantineMax+10)
	for i := range keys {
		keys[i] = strconv.Itoa(i)
	}
	if dropped := q.add(keys); dropped != 10 || len(q.until) != quarantineMax {
		t.Fatalf("dropped %d, held %d", dropped, len(q.until))
	}
	now = now.Add(time.Second)
	if dropped := q.add(keys[:5]); dropped != 0 || len(q.until) != 5 {
		t.Fatalf("after expiry: dropped %d, held %d; want the expired swept", dropped, len(q.until))
	}
}
