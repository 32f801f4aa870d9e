package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/segmentio/kafka-go"
)

// publishPoll is how often publishPayment looks for the broker and the
// group's commit.
const publishPoll = 100 * time.Millisecond

// publishPayment produces one payment to the topic, its payment_id as the
// Idempotency-Key header (and the record key, so that a payment's copies
// share a partition), and waits until the group committed an offset past
// it: a consumer booked it, or found it a duplicate, and committed. It waits
// for the broker too, which a consumer started with -embedded just before
// runs, all within timeout.
func publishPayment(ctx context.Context, cfg config, body []byte, timeout time.Duration, out io.Writer) error {
	var p payment
	if err := json.Unmarshal(body, &p); err != nil || p.PaymentID == "" {
		if err == nil {
			err = errors.New(`no "payment_id"`)
		}
		return fmt.Errorf(`-publish wants a payment such as {"payment_id":"pay-1","account":"acct-7","amount_cents":1900}: %w`, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	// The topic's partitions, once a broker answers.
	var partitions []int
	if err := poll(ctx, func() bool {
		conn, err := kafka.DialContext(ctx, "tcp", cfg.Brokers[0])
		if err != nil {
			return false
		}
		defer conn.Close()
		parts, err := conn.ReadPartitions(cfg.Topic)
		for _, part := range parts {
			partitions = append(partitions, part.ID)
		}
		return err == nil && len(partitions) > 0
	}); err != nil {
		return fmt.Errorf("no broker with topic %s at %s: %w", cfg.Topic, cfg.Brokers[0], err)
	}

	msg := kafka.Message{Key: []byte(p.PaymentID), Value: body,
		Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(p.PaymentID)}}}
	partition := (&kafka.Hash{}).Balance(msg, partitions...)
	leader, err := kafka.DialLeader(ctx, "tcp", cfg.Brokers[0], cfg.Topic, partition)
	if err != nil {
		return fmt.Errorf("connect to the leader of %s/%d: %w", cfg.Topic, partition, err)
	}
	defer leader.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = leader.SetDeadline(deadline)
	}
	_, _, offset, _, err := leader.WriteCompressedMessagesAt(nil, msg)
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	fmt.Fprintf(out, "published %s to %s/%d at offset %d; ", p.PaymentID, cfg.Topic, partition, offset)

	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: transport}
	if err := poll(ctx, func() bool {
		resp, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: cfg.Group,
			Topics: map[string][]int{cfg.Topic: {partition}}})
		if err != nil || resp.Error != nil {
			return false
		}
		for _, part := range resp.Topics[cfg.Topic] {
			if part.Partition == partition && part.Error == nil && part.CommittedOffset > offset {
				return true
			}
		}
		return false
	}); err != nil {
		fmt.Fprintln(out, "not committed")
		return fmt.Errorf("waiting for group %s to commit past offset %d (is a consumer running?): %w", cfg.Group, offset, err)
	}
	fmt.Fprintf(out, "committed by %s\n", cfg.Group)
	return nil
}

// poll calls done every publishPoll until it reports true or ctx ends.
func poll(ctx context.Context, done func() bool) error {
	t := time.NewTicker(publishPoll)
	defer t.Stop()
	for !done() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
