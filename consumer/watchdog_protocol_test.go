package consumer

import (
	"testing"
	"time"
)

func TestWatchdogWatchesClassicGroupsOnly(t *testing.T) {
	for _, c := range []struct {
		protocol string
		session  time.Duration
		want     bool
	}{
		{"", 45 * time.Second, true},
		{ProtocolClassic, 45 * time.Second, true},
		{ProtocolConsumer, 45 * time.Second, false}, // the broker's session timeout, not the client's
		{ProtocolClassic, 0, false},
	} {
		if got := watches(c.protocol, c.session); got != c.want {
			t.Errorf("watches(%q, %v) = %v, want %v", c.protocol, c.session, got, c.want)
		}
	}
}
