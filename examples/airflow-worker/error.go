package main

import "errors"

// errNoContext: the Airflow context variables are missing or malformed; the
// worker writes nothing and exits 2.
var errNoContext = errors.New("no Airflow task context")
