package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// brokerTimeout bounds how long checkBrokers waits for a broker to answer.
const brokerTimeout = 10 * time.Second

// checkBrokers asks the brokers for topic's partitions before the consumer
// joins its group: kafka-go's group would otherwise retry a broker that is
// not there forever, logging nothing. It returns the number of partitions,
// or an error that says what to do.
func checkBrokers(ctx context.Context, brokers []string, topic string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, brokerTimeout)
	defer cancel()
	dialer := &kafka.Dialer{Timeout: brokerTimeout}
	var errs []error
	for _, b := range brokers {
		conn, err := dialer.DialContext(ctx, "tcp", b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if deadline, ok := ctx.Deadline(); ok {
			_ = conn.SetDeadline(deadline)
		}
		parts, err := conn.ReadPartitions(topic)
		_ = conn.Close()
		switch {
		case errors.Is(err, kafka.UnknownTopicOrPartition) || (err == nil && len(parts) == 0):
			return 0, fmt.Errorf("topic %s does not exist on %s: create it (or set KAFKA_TOPIC)", topic, b)
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", b, err))
			continue
		}
		return len(parts), nil
	}
	return 0, fmt.Errorf("no Kafka broker answers at %s: %w (start one, set KAFKA_BROKERS, or pass -embedded)",
		strings.Join(brokers, ","), errors.Join(errs...))
}
