package redisfence

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/batonhq/baton/fence"
)

// defaultPrefix is the prefix of every key the store writes, unless [Prefix] says otherwise.
const defaultPrefix = "baton:"

// prefixRE is what a prefix may hold: no braces (the hash tags are the store's), no spaces.
var prefixRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,63}$`)

// escaper makes a name safe inside a key: the hash tag's braces, the separators '/' and ':'
// and the escape character itself are written as %XX, so every key names one thing only.
var escaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D", "/", "%2F", ":", "%3A")

// HashTag returns the hash tag of (group, topic): every fence of the topic's partitions, its
// recoveries, its topic identity and the caller's keys written in the same transaction must
// contain it to share one hash slot on a Redis Cluster, e.g. "twin:" + HashTag(g, t) + ":dev-7".
// A standalone server does not need it.
func HashTag(group, topic string) string {
	return "{" + escaper.Replace(group) + "/" + escaper.Replace(topic) + "}"
}

// keys builds the store's key names. The layout, for prefix P, group g, topic t, partition p,
// keyed scope s and id i (each name escaped):
//
//	P{g/t}:fence:p       hash era, epoch, pos, claimant: the fence of partition p
//	P{g/t}:fence:p:hold  string: the transaction holding the fence (expires)
//	P{g/t}:recovery:p    stream: the recorded recoveries of partition p
//	P{g/t}:partitions    set: the partitions with a fence
//	P{g/t}:topic         hash seq, id, partitions: the topic identity
//	P{g/t}:topics        stream: the topic identity's records
//	P{s}:admit:i         hash era, epoch, seq: a keyed fence
//	P{s}:admit:i:hold    string: the transaction holding it (expires)
type keys struct{ prefix string }

func (n keys) topic(group, topic string) string { return n.prefix + HashTag(group, topic) }

func (n keys) fence(k fence.Key) string {
	return n.topic(k.Group, k.Topic) + ":fence:" + strconv.FormatInt(int64(k.Partition), 10)
}

func (n keys) recovery(k fence.Key) string {
	return n.topic(k.Group, k.Topic) + ":recovery:" + strconv.FormatInt(int64(k.Partition), 10)
}

func (n keys) partitions(group, topic string) string { return n.topic(group, topic) + ":partitions" }
func (n keys) identity(group, topic string) string   { return n.topic(group, topic) + ":topic" }
func (n keys) history(group, topic string) string    { return n.topic(group, topic) + ":topics" }

func (n keys) admit(scope, id string) string {
	return n.prefix + "{" + escaper.Replace(scope) + "}:admit:" + escaper.Replace(id)
}

func hold(key string) string { return key + ":hold" }

func validatePrefix(p string) error {
	if !prefixRE.MatchString(p) {
		return fmt.Errorf("%w: key prefix %q: want 1 to 63 of A-Z a-z 0-9 _ . : -", fence.ErrInvalid, p)
	}
	return nil
}

// slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash tag, or of the whole
// key if it has none, modulo 16384.
func slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
