package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// inputKind is what an input is designed to do; its id says it by its
// prefix, so that every handler, worker subprocess and audit can tell
// without sharing state.
type inputKind int

const (
	kindNormal  inputKind = iota // m-…: processed once, its effect committed
	kindFails                    // f-…: its handler always fails; it must end failed or dead-lettered
	kindKeyless                  // k-…: published without a key where the transport can; it must be dead-lettered
)

var kindPrefix = [...]string{kindNormal: "m-", kindFails: "f-", kindKeyless: "k-"}

// kindOf returns the kind of input id.
func kindOf(id string) inputKind {
	for k, p := range kindPrefix {
		if strings.HasPrefix(id, p) {
			return inputKind(k)
		}
	}
	return kindNormal
}

// countKind counts the ids of kind k in unique.
func countKind(unique map[string]bool, k inputKind) int {
	n := 0
	for id := range unique {
		if kindOf(id) == k {
			n++
		}
	}
	return n
}

// genInputs returns n message ids of which about dup repeat an earlier one:
// half of the repeats pick one of the last few ids, so that both copies are
// in flight at the same time, the other half any earlier id. Of the unique
// ids, about poison are designed to fail (f-…) and about keyless are sent
// without a key (k-…); the rest are ordinary (m-…).
func genInputs(n int, dup float64, workers int, seed uint64, poison, keyless float64) ([]string, map[string]bool) {
	rng := rand.New(rand.NewPCG(seed, 1))
	ids := make([]string, 0, n)
	unique := make(map[string]bool, n)
	next := 0
	for len(ids) < n {
		if len(ids) > 0 && rng.Float64() < dup {
			var id string
			if rng.IntN(2) == 0 {
				id = ids[len(ids)-1-rng.IntN(min(len(ids), 2*workers))]
			} else {
				id = ids[rng.IntN(len(ids))]
			}
			ids = append(ids, id)
			continue
		}
		kind := kindNormal
		switch r := rng.Float64(); {
		case r < poison:
			kind = kindFails
		case r < poison+keyless:
			kind = kindKeyless
		}
		id := fmt.Sprintf("%s%06d", kindPrefix[kind], next)
		next++
		ids = append(ids, id)
		unique[id] = true
	}
	return ids, unique
}
