package direct

import "testing"

// TestPeekAheadWindow: a claim peeks while one of the last PeekWindow claims
// found its key taken, including a claim numbered after it that found its
// key taken between its number and its decision; it does not peek before any
// duplicate or after the window.
func TestPeekAheadWindow(t *testing.T) {
	var p Ahead
	if _, ahead := p.Next(); ahead {
		t.Fatal("peek before any duplicate")
	}
	// Claim 6 takes its number while claim 7, begun after it, has already
	// found its key taken.
	p.seq.Store(5)
	p.taken.Store(7)
	if n, ahead := p.Next(); n != 6 || !ahead {
		t.Fatalf("claim %d, numbered before the duplicate it decides after: peek %v, want true", n, ahead)
	}
	p.Found(6) // an earlier claim's finding keeps the later one
	if got := p.taken.Load(); got != 7 {
		t.Fatalf("taken = %d, want 7", got)
	}
	p.seq.Store(7 + PeekWindow - 1)
	if n, ahead := p.Next(); !ahead {
		t.Fatalf("claim %d, the last of the window: no peek", n)
	}
	if n, ahead := p.Next(); ahead {
		t.Fatalf("claim %d, after the window: peek", n)
	}
}
