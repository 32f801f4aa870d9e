package dedupekafka

import (
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestDescribeHeadersDoNotAliasTheMessage: an Observer that sets a header
// through the MessageInfo (a propagator's Inject) leaves the handler's
// message as it was.
func TestDescribeHeadersDoNotAliasTheMessage(t *testing.T) {
	msg := kafka.Message{Topic: "t", Headers: []kafka.Header{
		{Key: "traceparent", Value: []byte("A")}, {Key: "message-id", Value: []byte("m-1")}}}
	info := describe("g")(msg)
	info.Headers.Set("traceparent", "B")
	if got := msg.Headers[0].Key + "=" + string(msg.Headers[0].Value); got != "traceparent=A" {
		t.Errorf("the handler's msg.Headers[0] is now %q after the Observer's Set", got)
	}
	if got := info.Headers.Get("traceparent"); got != "B" {
		t.Errorf("Get after Set = %q, want B", got)
	}
	if keys := info.Headers.Keys(); len(keys) != 2 {
		t.Errorf("Keys = %v, want traceparent and message-id once each", keys)
	}
}
