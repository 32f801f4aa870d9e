package txopts

import (
	"fmt"
	"strings"
	"time"
)

// Settings returns the argument of the root's sqlTxSettings for a
// consumer's claim transaction (its lock timeout and synchronous_commit),
// "" when it has none. The values are validated (ValidSyncCommit): nothing
// needs escaping.
func Settings(lockTimeout time.Duration, syncCommit string) string {
	var s []string
	if lockTimeout > 0 {
		s = append(s, fmt.Sprintf(`"lock_timeout":"%dms"`, max(lockTimeout.Milliseconds(), 1)))
	}
	if syncCommit != "" {
		s = append(s, `"synchronous_commit":"`+syncCommit+`"`)
	}
	if len(s) == 0 {
		return ""
	}
	return "{" + strings.Join(s, ",") + "}"
}

// ValidSyncCommit reports a value of synchronous_commit that a consumer's
// claim transaction accepts.
func ValidSyncCommit(s string) bool {
	switch s {
	case "", "on", "remote_apply", "remote_write", "local", "off":
		return true
	}
	return false
}
