package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/httpidem"
)

// runHTTPIdem soaks the Idempotency-Key middleware in its default,
// transactional mode: clients POST every input with the input's id as
// Idempotency-Key (the tenant is the transport's scope) and retry on
// anything but a 2xx, including 409 while the key is held; with the
// redelivery fault they send an accepted request once more and must get the
// stored response replayed. The handler writes its effect through
// httpidem.Tx, in the transaction that holds the claim, and fails or panics
// at random (RetryServerErrors, so a failed request's retry executes
// again). One in-process server is closed abruptly at random; the server
// subprocess is killed mid-transaction, and its claims roll back with it.
func runHTTPIdem(ctx context.Context, e *env, inputs []string) error {
	return runHTTP(ctx, e, inputs, httpidemKind)
}

var httpidemKind = httpKind{
	server: func(ctx context.Context, e *env, pool *pgxpool.Pool) (http.Handler, error) {
		mw, err := newIdemMiddleware(e, pool)
		if err != nil {
			return nil, err
		}
		if err := mw.Migrate(ctx); err != nil {
			return nil, err
		}
		return mw.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := idemEffect(r, e); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			switch {
			case e.faults.hit(faultError):
				http.Error(w, errInjected.Error(), http.StatusInternalServerError)
				return
			case e.faults.hit(faultPanic):
				panic("soak: injected panic")
			}
			w.WriteHeader(http.StatusCreated)
		}), nil
	},
	request: func(ctx context.Context, addr, id string) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/orders",
			bytes.NewReader([]byte(`{"order":"`+id+`"}`)))
		if err != nil {
			return nil, err
		}
		req.Header.Set(httpidem.DefaultHeader, id)
		req.Header.Set("Content-Type", "application/json")
		return req, nil
	},
}

// newIdemMiddleware is the middleware of the parent and the subprocess.
func newIdemMiddleware(e *env, pool *pgxpool.Pool) (*httpidem.Middleware, error) {
	scope := e.scope
	return httpidem.New(pool, httpidem.Config{
		Inbox: dedupe.Config{
			Table:       dedupe.DefaultTable,
			Lease:       max(e.soak.opts.lease, time.Second),
			MaxAttempts: -1,
			Logger:      e.soak.libLog(),
		},
		KeyRequired:  true,
		Tenant:       func(*http.Request) (string, error) { return scope, nil },
		ServerErrors: httpidem.RetryServerErrors,
		Logger:       e.soak.libLog(),
	})
}

// idemEffect writes the request's one effect through its transaction.
func idemEffect(r *http.Request, e *env) error {
	tx, err := httpidem.Tx(r.Context())
	if err != nil {
		return err
	}
	c := httpidem.ClaimFromContext(r.Context())
	if c == nil {
		return errors.New("soak: no claim in the request")
	}
	return effect(r.Context(), tx, e.name, c.Key.ID)
}

// httpidemChild is the server subprocess of the httpidem transport.
func httpidemChild(ctx context.Context, e *env, fl *childFlags, say func(verb, arg string)) error {
	pool, err := e.consumerPool(ctx, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	mw, err := newIdemMiddleware(e, pool)
	if err != nil {
		return err
	}
	h := mw.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := idemEffect(r, e); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		say("tx", httpidem.ClaimFromContext(r.Context()).Key.ID)
		time.Sleep(inTxPause)
		w.WriteHeader(http.StatusCreated)
	})
	err = serveWebhook(ctx, fl.webhookAddr, h, func(addr string) { say("addr", addr) })
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
