package exampledb

import (
	"context"
	"errors"
	"flag"
	"net"
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
