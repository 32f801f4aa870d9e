package main

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
)

// clockTicks is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on Linux).
const clockTicks = 100

// pgCPU reads how much CPU the PostgreSQL backends serving the benchmark's
// pool have used, from /proc: the server's cost per message, on which a
// "claims per second per PostgreSQL core" figure rests. It only works where
// the server runs on this machine and its processes are visible (the
// benchmark only targets this machine); elsewhere it reports nothing. The
// backends are found by their application_name through a connection of
// their own, outside the pool, so the lookup costs the pool no round trip.
type pgCPU struct {
	mu   sync.Mutex
	conn *pgx.Conn
	app  string
}

// ticks returns the CPU time (user + system, in clock ticks) each of the
// pool's backends has used so far, or nil when it cannot be read.
func (p *pgCPU) ticks() map[int32]int64 {
	if p == nil || p.conn == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	rows, err := p.conn.Query(context.Background(),
		`SELECT pid FROM pg_stat_activity WHERE application_name = $1`, p.app)
	if err != nil {
		return nil
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return nil
	}
	out := make(map[int32]int64, len(pids))
	for _, pid := range pids {
		t, ok := procTicks(int(pid))
		if !ok {
			return nil
		}
		out[pid] = t
	}
	return out
}

// cpuSince is the CPU the backends used between two readings, in clock
// ticks: a backend seen only in the later one (a connection opened
// meanwhile) counts from its start.
func cpuSince(t0, t1 map[int32]int64) (int64, bool) {
	if t0 == nil || t1 == nil {
		return 0, false
	}
	var sum int64
	for pid, t := range t1 {
		sum += t - t0[pid]
	}
	return sum, true
}

// procTicks returns utime + stime of a process from /proc/<pid>/stat.
func procTicks(pid int) (int64, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// the fields after its closing parenthesis start at field 3.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(raw[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(string(f[11]), 10, 64) // field 14
	stime, err2 := strconv.ParseInt(string(f[12]), 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return utime + stime, true
}
