package exampledb

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

func TestDefault(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	if got := Default(getenv); got != LocalURL {
		t.Fatalf("Default without DATABASE_URL = %q, want %q", got, LocalURL)
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	u := Flag(fs, getenv)
	if *u != LocalURL || Source(*u, getenv) != "127.0.0.1:5432" {
		t.Fatalf("flag default %q (source %q)", *u, Source(*u, getenv))
	}
	env["DATABASE_URL"] = "postgres://a@b/c"
	if got := Default(getenv); got != "postgres://a@b/c" || Source(got, getenv) != "DATABASE_URL" {
		t.Fatalf("Default with DATABASE_URL = %q", got)
	}
	fs = flag.NewFlagSet("x", flag.ContinueOnError)
	u = Flag(fs, getenv)
	if err := fs.Parse([]string{"-database-url", "postgres://d@e/f"}); err != nil || *u != "postgres://d@e/f" || Source(*u, getenv) != "-database-url" {
		t.Fatalf("-database-url: %q, %v", *u, err)
	}
}

// TestCheckSaysWhatToDo: a server that does not answer is reported with
// its address and what to do, wrapping ErrUnreachable.
func TestCheckSaysWhatToDo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	err = Check(context.Background(), "postgres://postgres:secret@"+addr+"/test?sslmode=disable")
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("Check = %v, want ErrUnreachable", err)
	}
	for _, want := range []string{addr, "DATABASE_URL", "docker run"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error shows the password:\n%v", err)
	}
}

// TestSchemaName: dedupe_<example>_<8 hex digits>, fresh each time.
func TestSchemaName(t *testing.T) {
	a, b := SchemaName("watermill-router"), SchemaName("watermill-router")
	if !regexp.MustCompile(`^dedupe_watermill_router_[0-9a-f]{8}$`).MatchString(a) || a == b {
		t.Fatalf("SchemaName = %q, then %q", a, b)
	}
}

// TestInSchema: the search_path is set (replacing one already there) and
// the rest of the URL kept; a URL that is not postgres:// is refused
// without echoing it.
func TestInSchema(t *testing.T) {
	got, err := InSchema("postgres://u:pw@h:5432/db?sslmode=disable&search_path=old", "s1")
	if err != nil {
		t.Fatal(err)
	}
	p, err := url.Parse(got)
	if err != nil || p.Query().Get("search_path") != "s1" || p.Query().Get("sslmode") != "disable" ||
		p.Host != "h:5432" || p.Path != "/db" || p.User.String() != "u:pw" {
		t.Fatalf("InSchema = %q, %v", got, err)
	}
	if _, err := InSchema("host=h password=secret", "s1"); err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("InSchema of a key=value string: %v", err)
	}
}
