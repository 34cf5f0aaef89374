package consumer

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/internal/claimant"
)

// memberIdentity returns the identity of the client's group member (claimant.Identity): its
// group.instance.id if static, otherwise its member id; "" if it has neither (never matched).
func memberIdentity(cl *kgo.Client) string {
	member, _ := cl.GroupMetadata()
	instance, _ := cl.OptValue(kgo.InstanceID).(string)
	return claimant.Identity(instance, member)
}
