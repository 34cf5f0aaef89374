package status_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/operator/status"
)

// TestEndOffsetsNotFromADeposedLeader: the partition's leadership moved (its leader epoch
// went up) and the old leader, cut off, still answers as the leader at its old epoch, with its
// old end offset. The collector is seeded with the old leader alone, so the client's first
// view of the cluster is the stale one; the high watermark must still be the new leader's.
func TestEndOffsetsNotFromADeposedLeader(t *testing.T) {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	addrs := cluster.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(n int) {
		for range n {
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	produce(10)
	old := cluster.LeaderFor("t", 0)
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr("t")
	req.Topics = append(req.Topics, rt)
	stale, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	oldEpoch := stale.Topics[0].Partitions[0].LeaderEpoch
	if err := cluster.MoveTopicPartition("t", 0, 1-old); err != nil {
		t.Fatal(err)
	}
	produce(5) // the new leader's log: 15 records; the old one stopped at 10

	// The deposed leader: its metadata still names itself at the old epoch, and it answers
	// for the end offset at that epoch (or none) with 10; asked at a later epoch it refuses.
	var asked atomic.Int32
	cluster.ControlKey(int16(kmsg.Metadata), func(r kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if cluster.CurrentNode() != old {
			return nil, nil, false
		}
		resp := *stale
		resp.Version = r.GetVersion()
		return &resp, nil, true
	})
	cluster.ControlKey(int16(kmsg.ListOffsets), func(r kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if cluster.CurrentNode() != old {
			return nil, nil, false
		}
		asked.Add(1)
		lreq := r.(*kmsg.ListOffsetsRequest)
		resp := lreq.ResponseKind().(*kmsg.ListOffsetsResponse)
		for _, rt := range lreq.Topics {
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition, sp.Offset, sp.LeaderEpoch = rp.Partition, 10, oldEpoch
				if rp.CurrentLeaderEpoch > oldEpoch {
					sp.ErrorCode, sp.Offset = kerr.UnknownLeaderEpoch.Code, -1
				}
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})

	path := filepath.Join(t.TempDir(), "f.db")
	store, err := sqlitefence.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	store.Close()
	// Which broker a client asks first is the client's choice: read it 20 times, each from a
	// new collector whose only seed is the deposed leader.
	for i := range 20 {
		c, err := status.NewCollector(status.Config{Brokers: []string{addrs[old]}, Store: path, Group: "g", Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		kv, err := c.Kafka(ctx, []string{"t"})
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		k := fence.Key{Group: "g", Topic: "t", Partition: 0}
		if got, ok := kv.HighWatermark[k]; !ok || got != 15 {
			t.Fatalf("read %d: high watermark %d (read: %v), want 15, the new leader's, not the deposed leader's 10 (the deposed leader was asked for it %d times)", i, got, ok, asked.Load())
		}
	}
}
