package direct

import "sync/atomic"

// PeekWindow is how many claims after one that found its key taken still
// send the read of an existing key with the claim (Ahead).
const PeekWindow = 64

// Ahead decides, for the direct claim round and for
// Inbox.Claim over pgx (httpidem's transactional claim among its callers),
// whether the read of an existing key (the peek; Inbox.Claim's reads the
// whole row, stored result included) goes in the claim's round trip or only
// after a claim that found its key taken. In the round, a duplicate costs
// one round trip but every new key pays the read, an index lookup that finds
// the row it just inserted: at 32 concurrent claims on two cores, about 6%
// of the transaction's PostgreSQL time (pgbench, the round's statements with
// and without it). After, a new key pays nothing and a duplicate a second
// round trip. So the peek goes in the round while one of the last
// PeekWindow claims of the inbox found its key taken: a stream of
// duplicates (a redelivered backlog, a retrying client) is classified in one
// round trip each after its first, and a stream of new keys reads nothing.
// Both orders classify the key the same way: the peek is a read of the
// committed row in a fresh snapshot either way (READ COMMITTED).
type Ahead struct {
	seq   atomic.Uint64 // claims decided so far
	taken atomic.Uint64 // seq of the last claim that found its key taken; 0: none yet
}

// Next decides for one claim: it returns the claim's sequence number and
// whether its round carries the peek.
func (p *Ahead) Next() (uint64, bool) {
	n := p.seq.Add(1)
	t := p.taken.Load()
	// t > n: a claim that began after this one found its key taken first.
	return n, t != 0 && (t >= n || n-t <= PeekWindow)
}

// Found records that claim n found its key taken.
func (p *Ahead) Found(n uint64) {
	for {
		t := p.taken.Load()
		if t >= n || p.taken.CompareAndSwap(t, n) {
			return
		}
	}
}
