package embeddedkafka

import (
	"fmt"
	"net"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Broker is a one-broker Kafka-protocol cluster running in this
// process (franz-go's kfake), with its log in memory.
type Broker struct {
	c *kfake.Cluster
}

// Start starts a Kafka-protocol broker listening on addr ("host:port"; port
// 0 picks a free one) with each of topics created with partitions
// partitions. Topics that clients ask for are created too, with as many
// partitions. Close stops it.
func Start(addr string, partitions int32, topics ...string) (*Broker, error) {
	if partitions < 1 {
		return nil, fmt.Errorf("embedded Kafka: partitions = %d, want at least 1", partitions)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("embedded Kafka: address %q: %w", addr, err)
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(int(partitions)),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, addr) }),
	}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(partitions, topics...))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded Kafka: %w", err)
	}
	return &Broker{c: c}, nil
}

// Addrs are the addresses clients connect to (one broker).
func (k *Broker) Addrs() []string { return k.c.ListenAddrs() }

// Close stops the broker; its log is gone.
func (k *Broker) Close() { k.c.Close() }
