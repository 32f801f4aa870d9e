package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/exactlyonce/dedupe"
	"github.com/exactlyonce/dedupe/adapters/webhook"
)

// webhookEndpoint is the receivers' endpoint (Config.Endpoint).
const webhookEndpoint = "soak-webhook"

// webhookKey is the soak's Standard Webhooks signing key.
var webhookKey = []byte("dedupe-soak-standard-webhooks-k!")

// runWebhook soaks the Standard Webhooks receiver: senders post every input
// (webhook-id = its id) to one of two in-process receivers or the receiver
// subprocess, and re-send on anything but a 2xx, as providers do; with the
// redelivery fault they re-send an accepted event once more. One in-process
// receiver is closed abruptly at random (its requests in flight are cut) and
// restarted; the subprocess is killed mid-transaction.
func runWebhook(ctx context.Context, e *env, inputs []string) error {
	return runHTTP(ctx, e, inputs, webhookKind)
}

// httpKind is one HTTP transport: how to build its server and its requests.
type httpKind struct {
	// server builds the in-process receiver (parent) over pool.
	server func(ctx context.Context, e *env, pool *pgxpool.Pool) (http.Handler, error)
	// request builds one delivery of id to addr.
	request func(ctx context.Context, addr, id string) (*http.Request, error)
	// final, when set, reports whether a response other than a 2xx ends the
	// deliveries of an input all the same: the receiver marked it failed,
	// and the provider, whose retries would end some day, stops now.
	final func(status int, body []byte) bool
}

var webhookKind = httpKind{
	server: func(_ context.Context, e *env, pool *pgxpool.Pool) (http.Handler, error) {
		inbox, err := dedupe.New(pool, soakConfig(e))
		if err != nil {
			return nil, err
		}
		return newWebhookHandler(inbox, e, faultyHandler[webhook.Event](e, nil))
	},
	request: webhookRequest,
	final: func(status int, body []byte) bool {
		return status == http.StatusInternalServerError && strings.HasPrefix(string(body), "event marked failed")
	},
}

// runHTTP soaks an HTTP transport: senders deliver every input to one of two
// in-process servers or the server subprocess until one accepts it.
func runHTTP(ctx context.Context, e *env, inputs []string, kind httpKind) error {
	o := e.soak.opts
	pool, err := e.consumerPool(ctx, int32(o.workers)*3+1)
	if err != nil {
		return err
	}
	defer pool.Close()
	h, err := kind.server(ctx, e, pool)
	if err != nil {
		return err
	}
	var (
		targets   [3]atomic.Pointer[string] // two in-process receivers, the child
		delivered atomic.Bool
	)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: o.workers}}
	defer client.CloseIdleConnections()
	return runExternal(ctx, e, external{
		consumers: 2,
		consume: func(ctx context.Context, n int) error {
			return serveWebhook(ctx, "127.0.0.1:0", h, func(addr string) { targets[n].Store(&addr) })
		},
		childArgs: []string{},
		onChildLine: func(verb, arg string) {
			if verb == "addr" {
				targets[2].Store(&arg)
			}
		},
		feed: func(ctx context.Context) error {
			err := sendAll(ctx, e, client, inputs, kind, func() string {
				for {
					if t := targets[e.faults.intn(len(targets))].Load(); t != nil {
						return *t
					}
					if ctx.Err() != nil {
						return ""
					}
					time.Sleep(time.Millisecond)
				}
			})
			if err == nil {
				delivered.Store(true)
			}
			return err
		},
		done: func(ctx context.Context) (bool, error) {
			if !delivered.Load() {
				return false, nil
			}
			return e.settledInDB(ctx)
		},
	})
}

func newWebhookHandler(inbox *dedupe.Inbox, e *env, h dedupe.HandlerFunc[webhook.Event]) (*webhook.Handler, error) {
	return webhook.NewStandard(inbox, webhook.StandardConfig{
		Secrets: []string{"whsec_" + base64.StdEncoding.EncodeToString(webhookKey)},
		Config: webhook.Config{
			Endpoint:    webhookEndpoint,
			LockTimeout: 2 * time.Second,
			RetryAfter:  time.Second,
			Logger:      e.soak.libLog(),
			OnError:     func(*http.Request, int, error) {},
		},
	}, h)
}

// serveWebhook serves h on addr until ctx ends, then closes the server
// abruptly: requests in flight are cut off, as when a process stops.
func serveWebhook(ctx context.Context, addr string, h http.Handler, listening func(addr string)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	listening(ln.Addr().String())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = srv.Close()
		<-done
		return nil
	}
}

// sendAll posts every input with -workers senders until each got a 2xx (or
// a final answer).
func sendAll(ctx context.Context, e *env, client *http.Client, inputs []string, kind httpKind, target func() string) error {
	work := make(chan string)
	var wg sync.WaitGroup
	for range e.soak.opts.workers {
		wg.Go(func() {
			for id := range work {
				for resend := true; resend; {
					if !deliver(ctx, e, client, id, kind, target) {
						return
					}
					resend = e.faults.hit(faultRedeliver)
				}
			}
		})
	}
	for _, id := range inputs {
		select {
		case work <- id:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	return nil
}

// deliver posts one input until a server accepts it (2xx) or gives a final
// answer; false when ctx ended first.
func deliver(ctx context.Context, e *env, client *http.Client, id string, kind httpKind, target func() string) bool {
	for ctx.Err() == nil {
		addr := target()
		if addr == "" {
			return false
		}
		req, err := kind.request(ctx, addr, id)
		if err != nil {
			return false
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
			_ = resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return true
			}
			if kind.final != nil && kind.final(resp.StatusCode, body) {
				if !e.designedToFail(id) {
					e.soak.log.Error("soak: an input not designed to fail was marked failed", "id", id)
				}
				return true
			}
			if resp.StatusCode/100 == 4 && resp.StatusCode != http.StatusConflict {
				e.soak.log.Error("soak: request refused", "id", id, "status", resp.StatusCode)
			}
		}
		sleepCtx(ctx, 10*time.Millisecond)
	}
	return false
}

// webhookRequest is a Standard Webhooks delivery of id, signed now.
func webhookRequest(ctx context.Context, addr, id string) (*http.Request, error) {
	body := []byte(`{"type":"order.paid","data":{"order":"` + id + `"}}`)
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	m := hmac.New(sha256.New, webhookKey)
	fmt.Fprintf(m, "%s.%s.%s", id, ts, body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/hook", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set(webhook.StandardIDHeader, id)
	req.Header.Set(webhook.StandardTimestampHeader, ts)
	req.Header.Set(webhook.StandardSignatureHeader, "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

// webhookChild is the webhook receiver subprocess: it reports its address,
// then serves until stopped.
func webhookChild(ctx context.Context, e *env, fl *childFlags, say func(verb, arg string)) error {
	pool, inbox, err := e.consumerInbox(ctx, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	h, err := newWebhookHandler(inbox, e, childHandler[webhook.Event](e, say))
	if err != nil {
		return err
	}
	err = serveWebhook(ctx, fl.webhookAddr, h, func(addr string) { say("addr", addr) })
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
