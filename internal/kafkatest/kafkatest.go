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
	return New(t, partitions, topics, extra).ListenAddrs()
}

// New is ClusterWith returning the cluster itself, for tests that hold or
// rewrite the broker's requests (kfake's ControlKey) to force an order of
// events a test cannot otherwise pin down.
func New(t testing.TB, partitions int32, topics []string, extra []kfake.Opt) *kfake.Cluster {
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
	return c
}
