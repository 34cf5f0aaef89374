package testenv

import (
	"fmt"
	"os"
)

// EnvGroupProtocol names the consumer group protocol the real-service tests of the consumer
// and the chaos run join with: "classic" (the default) or "consumer" (KIP-848). 'make
// test-kip848' runs them in both against a Kafka 4.3 broker.
const EnvGroupProtocol = "BATON_GROUP_PROTOCOL"

// GroupProtocol returns $BATON_GROUP_PROTOCOL, "classic" when unset. An unknown value panics:
// a matrix run must never silently fall back to the default protocol.
func GroupProtocol() string {
	switch v := os.Getenv(EnvGroupProtocol); v {
	case "":
		return "classic"
	case "classic", "consumer":
		return v
	default:
		panic(fmt.Sprintf("%s=%q: want classic or consumer", EnvGroupProtocol, v))
	}
}
