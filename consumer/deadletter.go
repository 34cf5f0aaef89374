package consumer

import (
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
)

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
	return append(hs,
		kgo.RecordHeader{Key: HeaderDLQReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderDLQGroup, Value: []byte(k.Group)},
		kgo.RecordHeader{Key: HeaderDLQTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		kgo.RecordHeader{Key: HeaderDLQOffset, Value: []byte(itoa(r.Offset))},
		kgo.RecordHeader{Key: HeaderDLQToken, Value: []byte(t.String())},
	)
}
