package webhook

import "github.com/exactlyonce/dedupe"

// describe is what the inbox's Observer is told of an event: its provider's
// event id, the endpoint and the request's headers.
func describe(e Event) dedupe.MessageInfo {
	m := dedupe.MessageInfo{System: "webhook", Destination: e.Provider + ":" + e.Endpoint, ID: e.ID, Partition: -1, Offset: -1}
	if e.Header != nil {
		m.Headers = dedupe.MapHeaders(e.Header)
	}
	return m
}
