package failover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BinDir holds the PostgreSQL binaries the harness runs (initdb, pg_ctl,
// pg_basebackup). FAILOVER_PG_BIN overrides it.
const BinDir = "/usr/lib/postgresql/15/bin"

const howTo = `failover: PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup) are needed in %s
  (Debian: apt-get install postgresql-15), or set FAILOVER_PG_BIN to their directory;
  as root the harness runs them as the "postgres" OS user, which must exist`

// Options configures a Cluster.
type Options struct {
	// Sync makes replication synchronous: synchronous_standby_names = '*'
	// with synchronous_commit as SyncCommit (default "on"). Otherwise it is
	// asynchronous, PostgreSQL's default.
	Sync bool
	// SyncCommit is synchronous_commit on the servers: "on" (the default)
	// or "remote_apply"; "local" or "off" make even Sync asynchronous.
	SyncCommit string
}

// Cluster is a primary and a streaming standby of PostgreSQL 15 on free
// loopback ports, in a directory of their own, run as the postgres OS user.
// Failover kills the primary, promotes the standby and rebuilds the old node
// as the new primary's standby, on its old port: the multi-host connection
// string URL stays valid across any number of failovers. Nothing here
// touches any other server.
type Cluster struct {
	t       testing.TB
	opts    Options
	bin     string
	base    string
	cred    *syscall.Credential
	uid     int
	gid     int
	nodes   [2]node
	primary int // index of the primary in nodes
}

type node struct {
	port int
	dir  string // data directory
	log  string // server log
}

// Start creates and starts a Cluster: initdb of the primary, then
// pg_basebackup of the standby, which streams from it. It stops the servers
// and removes their directory when the test ends.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.SyncCommit == "" {
		opts.SyncCommit = "on"
	}
	c := &Cluster{t: t, opts: opts, bin: BinDir}
	if b := os.Getenv("FAILOVER_PG_BIN"); b != "" {
		c.bin = b
	}
	for _, tool := range []string{"initdb", "pg_ctl", "pg_basebackup", "postgres"} {
		if _, err := os.Stat(filepath.Join(c.bin, tool)); err != nil {
			t.Fatalf(howTo+": %v", c.bin, err)
		}
	}
	c.uid, c.gid = os.Getuid(), os.Getgid()
	if os.Geteuid() == 0 { // initdb refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf(howTo+": %v", c.bin, err)
		}
		c.uid, _ = strconv.Atoi(u.Uid)
		c.gid, _ = strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(c.uid), Gid: uint32(c.gid)}
	}
	base, err := os.MkdirTemp("", "dedupe-failover-")
	if err != nil {
		t.Fatal(err)
	}
	c.base = base
	t.Cleanup(c.remove)
	if err := os.Chown(base, c.uid, c.gid); err != nil {
		t.Fatal(err)
	}
	for i := range c.nodes {
		c.nodes[i] = node{port: freePort(t), dir: filepath.Join(base, fmt.Sprintf("n%d", i+1)),
			log: filepath.Join(base, fmt.Sprintf("n%d.log", i+1))}
	}
	c.run("initdb", "-D", c.nodes[0].dir, "-U", "postgres", "--auth=trust", "--no-sync", "--no-instructions")
	c.configure(0)
	c.startNode(0)
	c.basebackup(1, 0)
	c.startNode(1)
	c.waitStreaming()
	return c
}

// freePort returns a loopback port nothing listens on now.
func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// configure writes node i's settings after initdb; a standby copies them
// with pg_basebackup and overrides its port.
//
// fsync is off for speed, and it does not weaken what a failover test
// measures: the primary is killed as a process (pg_ctl stop -m immediate),
// not the machine, so what it wrote stays in the operating system's cache
// either way, and it is never started again (its node is rebuilt from the
// new primary). What survives the failover is what the standby had
// received, which fsync does not change; synchronous replication waits for
// the standby's flush report, which it sends after writing, with fsync or
// without.
func (c *Cluster) configure(i int) {
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
max_connections = 50
shared_buffers = 16MB
fsync = off
full_page_writes = on
wal_level = replica
max_wal_senders = 5
wal_keep_size = 256MB
hot_standby = on
wal_receiver_status_interval = 1s
synchronous_commit = %s
synchronous_standby_names = '%s'
log_min_messages = warning
`, c.nodes[i].port, c.base, c.opts.SyncCommit, c.syncNames())
	c.appendConf(i, conf)
}

func (c *Cluster) syncNames() string {
	if c.opts.Sync {
		return "*"
	}
	return ""
}

func (c *Cluster) appendConf(i int, conf string) {
	f, err := os.OpenFile(filepath.Join(c.nodes[i].dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(conf); err != nil {
		c.t.Fatal(err)
	}
}

// basebackup makes node i a standby of node from.
func (c *Cluster) basebackup(i, from int) {
	if err := os.RemoveAll(c.nodes[i].dir); err != nil {
		c.t.Fatal(err)
	}
	c.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.nodes[from].port), "-U", "postgres",
		"-D", c.nodes[i].dir, "-X", "stream", "-R", "-c", "fast", "--no-sync")
	c.appendConf(i, fmt.Sprintf("\nport = %d\n", c.nodes[i].port))
}

func (c *Cluster) startNode(i int) {
	c.run("pg_ctl", "start", "-w", "-t", "120", "-D", c.nodes[i].dir, "-l", c.nodes[i].log)
}

// run runs a PostgreSQL binary as the postgres user and fails the test
// with its output when it fails.
func (c *Cluster) run(tool string, args ...string) {
	c.t.Helper()
	if out, err := c.exec(tool, args...); err != nil {
		c.t.Fatalf("failover: %s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
	}
}

func (c *Cluster) exec(tool string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(c.bin, tool), args...)
	cmd.Dir = c.base
	cmd.Env = os.Environ()
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
		cmd.Env = append(cmd.Env, "HOME="+c.base, "USER=postgres", "LOGNAME=postgres")
	}
	return cmd.CombinedOutput()
}

// URL is the multi-host connection string a client uses: both nodes, the
// read-write one chosen at each connection.
func (c *Cluster) URL() string {
	return fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable "+
		"target_session_attrs=read-write connect_timeout=5", c.nodes[0].port, c.nodes[1].port)
}

// NodeURL is the connection string of node i (0 or 1) alone.
func (c *Cluster) NodeURL(i int) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5",
		c.nodes[i].port)
}

// Ports returns the nodes' ports.
func (c *Cluster) Ports() [2]int { return [2]int{c.nodes[0].port, c.nodes[1].port} }

// Primary is the index of the primary node.
func (c *Cluster) Primary() int { return c.primary }

// PrimaryURL is the connection string of the current primary alone.
func (c *Cluster) PrimaryURL() string { return c.NodeURL(c.primary) }

// Kill stops the primary as a crash does: pg_ctl stop -m immediate, every
// server process quits at once, no shutdown checkpoint, and nothing more
// goes to the standby.
func (c *Cluster) Kill() {
	c.t.Helper()
	c.run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", c.nodes[c.primary].dir)
}

// SmartStop begins a smart shutdown of the primary and returns once a new
// connection to it is refused with SQLSTATE 57P03 ("the database system is
// shutting down"): the sessions it has go on until Kill (one of them must
// stay open, or the server stops); new ones are refused, as by a primary on
// its way down. It may be called from any goroutine.
func (c *Cluster) SmartStop(ctx context.Context) error {
	if out, err := c.exec("pg_ctl", "stop", "-m", "smart", "--no-wait", "-D", c.nodes[c.primary].dir); err != nil {
		return fmt.Errorf("pg_ctl stop -m smart: %w\n%s", err, out)
	}
	for {
		conn, err := pgx.Connect(ctx, c.PrimaryURL())
		if err == nil {
			conn.Close(ctx)
		} else if sqlState(err) == "57P03" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the primary does not refuse connections after a smart stop: %w", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func sqlState(err error) string {
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		return se.SQLState()
	}
	return ""
}

// Promote promotes the standby and waits until it accepts writes; it is
// then the primary. The old primary must be down (Kill).
func (c *Cluster) Promote() {
	c.t.Helper()
	c.primary = 1 - c.primary
	c.run("pg_ctl", "promote", "-w", "-t", "120", "-D", c.nodes[c.primary].dir)
}

// Rebuild makes the old primary's node a new standby of the current
// primary, on its old port: its data directory is replaced by a
// pg_basebackup, so whatever the killed primary had that the standby did not
// is gone, as when a failed machine is replaced. With synchronous
// replication the new primary's commits wait until it streams.
func (c *Cluster) Rebuild() {
	c.t.Helper()
	c.basebackup(1-c.primary, c.primary)
	c.startNode(1 - c.primary)
	c.waitStreaming()
}

// StallReplication stops (SIGSTOP) the primary's WAL senders, as a
// network that stalls: the standby receives nothing more, and with
// synchronous replication the primary's commits wait. Only Crash ends it.
func (c *Cluster) StallReplication(ctx context.Context) {
	c.t.Helper()
	conn, err := pgx.Connect(ctx, c.PrimaryURL())
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_replication`)
	if err != nil {
		c.t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		c.t.Fatalf("failover: no WAL sender to stall (%v)", err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			c.t.Fatalf("failover: stopping WAL sender %d: %v", pid, err)
		}
	}
}

// Crash kills the primary as a machine failure does: SIGKILL to its
// postmaster and then to every process of it, a stopped WAL sender's
// included, so what they had not sent is gone.
func (c *Cluster) Crash() {
	c.t.Helper()
	dir := c.nodes[c.primary].dir
	data, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		c.t.Fatal(err)
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[0]))
	if err != nil {
		c.t.Fatal(err)
	}
	children := childrenOf(pm)
	_ = syscall.Kill(pm, syscall.SIGKILL)
	for _, pid := range children {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// Wait until none of them is left, so that the node's port is free.
	for _, pid := range append(children, pm) {
		for syscall.Kill(pid, 0) == nil && !zombie(pid) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	// A killed postmaster nobody has reaped yet stays a zombie, and a
	// server started on its port reads the socket's lock file, finds that
	// pid alive and refuses to start ("lock file already exists"): remove
	// the lock files a clean shutdown would have removed.
	_ = os.Remove(filepath.Join(dir, "postmaster.pid"))
	sock := filepath.Join(c.base, fmt.Sprintf(".s.PGSQL.%d", c.nodes[c.primary].port))
	_ = os.Remove(sock + ".lock")
	_ = os.Remove(sock)
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(p); ok && ppid == pid {
			out = append(out, p)
		}
	}
	return out
}

// procStat returns the fields of /proc/pid/stat after the command name.
func procStat(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

func parentOf(pid int) (int, bool) {
	f := procStat(pid)
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

func zombie(pid int) bool {
	f := procStat(pid)
	return len(f) == 0 || f[0] == "Z"
}

// StopStandby stops the standby at once (pg_ctl stop -m immediate): with
// synchronous replication the primary's commits wait until StartStandby.
func (c *Cluster) StopStandby() {
	c.t.Helper()
	c.run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", c.nodes[1-c.primary].dir)
}

// StartStandby starts the standby again and waits until it streams.
func (c *Cluster) StartStandby() {
	c.t.Helper()
	c.startNode(1 - c.primary)
	c.waitStreaming()
}

// Failover kills the primary, promotes the standby and rebuilds the old
// primary as its standby.
func (c *Cluster) Failover() {
	c.t.Helper()
	c.Kill()
	c.Promote()
	c.Rebuild()
}

// waitStreaming waits until the primary has a standby streaming from it
// (and, for Sync, counted as synchronous).
func (c *Cluster) waitStreaming() {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	want := "async"
	if c.opts.Sync {
		want = "sync"
	}
	var last error
	for ctx.Err() == nil {
		last = func() error {
			conn, err := pgx.Connect(ctx, c.PrimaryURL())
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
				WHERE state = 'streaming' AND sync_state = $1 AND application_name <> 'pg_basebackup'`, want).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("no %s standby streaming yet", want)
			}
			return nil
		}()
		if last == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("failover: standby not streaming: %v\n%s", last, c.Logs())
}

// Logs returns the tail of both servers' logs, for a failure message.
func (c *Cluster) Logs() string {
	var b strings.Builder
	for i, n := range c.nodes {
		data, _ := os.ReadFile(n.log)
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		fmt.Fprintf(&b, "--- node %d (port %d) log:\n%s\n", i, n.port, data)
	}
	return b.String()
}

// remove stops both servers and removes their directory.
func (c *Cluster) remove() {
	for _, n := range c.nodes {
		if _, err := os.Stat(filepath.Join(n.dir, "postmaster.pid")); err == nil {
			if out, err := c.exec("pg_ctl", "stop", "-m", "immediate", "-w", "-D", n.dir); err != nil {
				c.t.Logf("failover: stopping %s: %v\n%s", n.dir, err, out)
			}
		}
	}
	if c.t.Failed() {
		c.t.Log(c.Logs())
	}
	if err := os.RemoveAll(c.base); err != nil {
		c.t.Logf("failover: removing %s: %v", c.base, err)
	}
}
