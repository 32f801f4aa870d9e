// Package kafkatest runs a real Kafka-protocol broker in-process for tests
// (franz-go's kfake), so kafka-go clients talk to it over loopback.
package kafkatest

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Cluster starts a kfake cluster with the topics seeded with partitions
// each, and closes it when the test ends. It returns the broker addresses.
func Cluster(t testing.TB, partitions int32, topics ...string) []string {
	t.Helper()
	return ClusterWith(t, partitions, topics, nil)
}

// ClusterWith is Cluster with extra kfake options, e.g.
// kfake.GroupMinSessionTimeout for fast consumer-group tests.
func ClusterWith(t testing.TB, partitions int32, topics []string, extra []kfake.Opt) []string {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(int(partitions))}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(partitions, topics...))
	}
	opts = append(opts, extra...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}
