package consumer

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
)

// deadLetterRecord returns the dead-letter copy of r for topic: r's key, value and timestamp,
// and its headers followed by Baton's (deadLetterHeaders).
func deadLetterRecord(topic string, r *kgo.Record, cause error, k fence.Key, t fence.Token) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp,
		Headers: deadLetterHeaders(r, cause, k, t)}
}

// maxDeadLetterReason bounds the baton.dlq.reason header: the cause's message, cut at a rune
// boundary.
const maxDeadLetterReason = 1024

// deadLetterHeaders returns the headers of r's dead-letter copy: r's own headers without any
// baton.dlq.* header (a producer cannot forge where a record came from or why it was
// dead-lettered: every baton.dlq.* header of the copy is Baton's, exactly once), then Baton's.
func deadLetterHeaders(r *kgo.Record, cause error, k fence.Key, t fence.Token) []kgo.RecordHeader {
	hs := make([]kgo.RecordHeader, 0, len(r.Headers)+6)
	for _, h := range r.Headers {
		if !strings.HasPrefix(strings.ToLower(h.Key), "baton.dlq.") {
			hs = append(hs, h)
		}
	}
	reason := "unknown"
	if cause != nil {
		reason = cause.Error()
	}
	if len(reason) > maxDeadLetterReason {
		// A handler's error may quote the record: unbounded, the copy would be up to twice
		// the record's size, over the outbox's message bound or the producer's for a record
		// the source topic took, and the partition would stop (or stall) on it.
		n := maxDeadLetterReason
		for n > 0 && !utf8.RuneStart(reason[n]) {
			n--
		}
		reason = reason[:n]
	}
	return append(hs,
		kgo.RecordHeader{Key: headerDLQReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: headerDLQGroup, Value: []byte(k.Group)},
		kgo.RecordHeader{Key: headerDLQTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: headerDLQPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		kgo.RecordHeader{Key: headerDLQOffset, Value: []byte(itoa(r.Offset))},
		kgo.RecordHeader{Key: headerDLQToken, Value: []byte(t.String())},
	)
}
