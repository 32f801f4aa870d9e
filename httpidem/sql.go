package httpidem

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// All SQL of the package: the guarded update of Versioned. The key table
// itself is the core inbox (dedupe's SQL).

// versionedSQL renders the statements of a Versioned for its table and
// columns. set is the caller's SET list using $1..$nArgs; the key columns
// follow as $nArgs+1.., then the acceptable versions and the wildcard flag.
//
//	UPDATE t SET <set>, version = version + 1
//	WHERE k1 = $n+1 AND … AND (version = ANY($n+k+1::bigint[]) OR $n+k+2::bool)
//	RETURNING version
func versionedUpdateSQL(table string, keys []string, version, set string, nArgs int) string {
	v := pgx.Identifier{version}.Sanitize()
	var b strings.Builder
	fmt.Fprintf(&b, "UPDATE %s SET %s, %s = %s + 1 WHERE ", table, set, v, v)
	for i, k := range keys {
		fmt.Fprintf(&b, "%s = $%d AND ", pgx.Identifier{k}.Sanitize(), nArgs+i+1)
	}
	n := nArgs + len(keys)
	fmt.Fprintf(&b, "(%s = ANY($%d::bigint[]) OR $%d::bool) RETURNING %s", v, n+1, n+2, v)
	return b.String()
}

// versionedCurrentSQL reads the current version of one row: $1.. the keys.
func versionedCurrentSQL(table string, keys []string, version string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "SELECT %s FROM %s WHERE ", pgx.Identifier{version}.Sanitize(), table)
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" AND ")
		}
		fmt.Fprintf(&b, "%s = $%d", pgx.Identifier{k}.Sanitize(), i+1)
	}
	return b.String()
}
