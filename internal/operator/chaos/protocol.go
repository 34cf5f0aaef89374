package chaos

import (
	"cmp"
	"os"

	"github.com/batonhq/baton/consumer"
)

// groupProtocol is the consumer group protocol Baton's chaos workers join with:
// $BATON_GROUP_PROTOCOL, "classic" when unset, or "consumer" (KIP-848: the token's epoch is the
// partition's assignment epoch). consumer.New refuses any other value. 'make test-kip848' runs
// the chaos run in both against a Kafka 4.3 broker; the session timeout of a KIP-848 group is
// the broker's (deploy/local/kafka.sh sets the harness's 3 s).
func groupProtocol() consumer.Option {
	return consumer.GroupProtocol(cmp.Or(os.Getenv("BATON_GROUP_PROTOCOL"), "classic"))
}
