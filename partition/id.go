package partition

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ID names one partition of a topic. It is the unit of ownership: the consumer group assigns
// whole IDs to members, and a [fence.Token] is captured per ID at assignment.
type ID struct {
	Topic     string
	Partition int32
}

// Of returns the ID of the partition r was consumed from (or was produced to).
func Of(r *kgo.Record) ID { return ID{Topic: r.Topic, Partition: r.Partition} }

// String formats id as "topic/partition", e.g. "orders/3". Kafka topic names cannot contain
// '/', so the form is unambiguous; [ParseID] reads it back.
func (id ID) String() string {
	return id.Topic + "/" + strconv.FormatInt(int64(id.Partition), 10)
}

// Validate returns an error wrapping [fence.ErrInvalid] if the topic is empty, too long, not UTF-8
// or contains NUL (the rules of a [fence.Key]'s names), or the partition is negative.
func (id ID) Validate() error {
	if err := fencecheck.ValidateIdentifier("topic", id.Topic); err != nil {
		return err
	}
	if id.Partition < 0 {
		return fmt.Errorf("%w: %s: partition %d is negative", fence.ErrInvalid, id.Topic, id.Partition)
	}
	return nil
}

// Key returns the fence key of id as consumed by group.
func (id ID) Key(group string) fence.Key {
	return fence.Key{Group: group, Topic: id.Topic, Partition: id.Partition}
}

// ParseID parses the "topic/partition" form written by [ID.String]. The partition must be a
// canonical non-negative decimal int32 (no sign, no leading zeros), so every ID has exactly one
// text form; the result is validated.
func ParseID(s string) (ID, error) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return ID{}, fmt.Errorf("%w: partition id %q is not topic/partition", fence.ErrInvalid, s)
	}
	topic, num := s[:i], s[i+1:]
	if num == "" || (len(num) > 1 && num[0] == '0') || num[0] == '+' || num[0] == '-' {
		return ID{}, fmt.Errorf("%w: partition id %q: partition is not a canonical number", fence.ErrInvalid, s)
	}
	p, err := strconv.ParseInt(num, 10, 32)
	if err != nil {
		return ID{}, fmt.Errorf("%w: partition id %q: %v", fence.ErrInvalid, s, err)
	}
	id := ID{Topic: topic, Partition: int32(p)}
	if err := id.Validate(); err != nil {
		return ID{}, err
	}
	return id, nil
}
