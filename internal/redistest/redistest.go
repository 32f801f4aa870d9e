// Package redistest connects tests to the machine's Redis (127.0.0.1:6379,
// or REDIS_URL), gives each test streams of its own and deletes them after
// it, and kills a client's connections to inject faults. Redis is not
// restarted by tests: it is shared, and keeps nothing on disk.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultURL is the Redis tests use when REDIS_URL is not set.
const DefaultURL = "redis://127.0.0.1:6379/0"

// StartCommand starts a Redis like the machine's, for the failure message.
const StartCommand = `redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no`

// URL returns REDIS_URL, else DefaultURL.
func URL() string {
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Options returns the client options of URL, with name as the connections'
// client name (CLIENT SETNAME), which Kill finds them by.
func Options(t testing.TB, name string) *redis.Options {
	t.Helper()
	opt, err := redis.ParseURL(URL())
	if err != nil {
		t.Fatalf("redistest: REDIS_URL %q: %v", URL(), err)
	}
	opt.ClientName = name
	return opt
}

// Client connects to Redis with a fresh client name and closes the client
// when the test ends. It fails the test (never skips) when Redis does not
// answer, saying how to start one.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	return ClientNamed(t, Name("client"))
}

// ClientNamed is Client with the given client name.
func ClientNamed(t testing.TB, name string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(Options(t, name))
	t.Cleanup(func() { _ = rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("redistest: Redis is not answering at %s (%v); these tests need it: set REDIS_URL, or start one with: %s",
			URL(), err, StartCommand)
	}
	return rdb
}

// Name returns prefix with a random suffix, for a stream, group or client
// name no other test uses.
func Name(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "dedupe-test-" + prefix + "-" + hex.EncodeToString(b[:])
}

// Stream returns a fresh stream name and deletes the stream (with its
// groups) when the test ends.
func Stream(t testing.TB, rdb *redis.Client, prefix string) string {
	t.Helper()
	name := Name(prefix)
	t.Cleanup(func() { Delete(rdb, name) })
	return name
}

// Delete deletes keys, ignoring errors (a cleanup).
func Delete(rdb *redis.Client, keys ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = rdb.Del(ctx, keys...).Err()
}

// Kill closes every connection whose client name is name (CLIENT KILL ID),
// as a network failure or a Redis restart would, and returns how many it
// closed. admin must be another client.
func Kill(ctx context.Context, admin *redis.Client, name string) (int, error) {
	list, err := admin.ClientList(ctx).Result()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		var id, cname string
		for _, f := range strings.Fields(line) {
			switch {
			case strings.HasPrefix(f, "id="):
				id = strings.TrimPrefix(f, "id=")
			case strings.HasPrefix(f, "name="):
				cname = strings.TrimPrefix(f, "name=")
			}
		}
		if cname != name || id == "" {
			continue
		}
		if err := admin.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil && !strings.Contains(err.Error(), "No such client") {
			return n, fmt.Errorf("redistest: kill client %s: %w", id, err)
		}
		n++
	}
	return n, nil
}
