package status

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A partition's end offset, read so that a deposed leader cannot answer for it.
//
// A broker cut off from the others (or from the controller) can go on believing it leads
// partitions whose leadership has moved: asked for their end offsets, it answers with its own,
// older high watermarks, below what the new leader has already served to the group. The
// client's cached metadata may still point at it. So the end offsets are read in two steps:
// every reachable broker is asked for the topics' metadata, and each partition is taken at the
// highest leader epoch any broker reports, with that epoch's leader; then each leader is asked
// for the end offsets with that epoch as the current leader epoch (KIP-320), which a broker
// that is no longer the leader at that epoch refuses (FENCED_LEADER_EPOCH, NOT_LEADER). A
// partition no broker answers for at its highest known epoch is left out: unknown, not guessed.

// tp names a topic partition.
type tp struct {
	topic     string
	partition int32
}

// leaderAt is a partition's leader at a leader epoch.
type leaderAt struct {
	leader, epoch int32
}

// endOffsets reads the high watermark of every partition of topics (see above).
func (c *Collector) endOffsets(ctx context.Context, topics []string) (map[tp]int64, error) {
	// Every broker the client knows (the requests before this one taught it the cluster) is
	// asked (viewsOf): the others' views decide past one that does not answer.
	brokers := c.kcl.DiscoveredBrokers()
	if len(brokers) == 0 {
		brokers = c.kcl.SeedBrokers()
	}
	requesters := make([]requester, len(brokers))
	for i, b := range brokers {
		requesters[i] = b
	}
	views, err := viewsOf(ctx, requesters, func() *kmsg.MetadataRequest { return metadataRequest(topics) })
	if err != nil {
		return nil, errorf(ErrUnreachable, "Kafka at %s: no broker described %s: %v", c.brokers(), strings.Join(topics, ","), err)
	}
	leaders := highestLeaders(views)

	byLeader := map[int32]*kmsg.ListOffsetsRequest{}
	for p, l := range leaders {
		req := byLeader[l.leader]
		if req == nil {
			req = kmsg.NewPtrListOffsetsRequest()
			req.ReplicaID = -1
			byLeader[l.leader] = req
		}
		var rt *kmsg.ListOffsetsRequestTopic
		for i := range req.Topics {
			if req.Topics[i].Topic == p.topic {
				rt = &req.Topics[i]
			}
		}
		if rt == nil {
			req.Topics = append(req.Topics, kmsg.NewListOffsetsRequestTopic())
			rt = &req.Topics[len(req.Topics)-1]
			rt.Topic = p.topic
		}
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.CurrentLeaderEpoch, rp.Timestamp = p.partition, l.epoch, -1 // -1: the end
		rt.Partitions = append(rt.Partitions, rp)
	}
	// A leader that does not answer is given half the time left (the log starts are read
	// next): its partitions are left out.
	lctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		lctx, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
		defer cancel()
	}
	var (
		out = map[tp]int64{}
		mu  sync.Mutex
		wg  sync.WaitGroup
	)
	for leader, req := range byLeader {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.kcl.Broker(int(leader)).Request(lctx, req)
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, t := range resp.(*kmsg.ListOffsetsResponse).Topics {
				for _, p := range t.Partitions {
					if kerr.ErrorForCode(p.ErrorCode) == nil {
						out[tp{t.Topic, p.Partition}] = p.Offset
					}
				}
			}
		}()
	}
	wg.Wait()
	return out, nil
}

// requester is what a *kgo.Broker does for viewsOf.
type requester interface {
	Request(context.Context, kmsg.Request) (kmsg.Response, error)
}

// viewsOf asks every broker at once for a metadata request of its own (the client sets the
// version on the request it sends, so one request is never shared between brokers); a broker
// that does not answer (cut off from this process, paused) is given a third of the time left,
// then left out. It fails only when none answers.
func viewsOf(ctx context.Context, brokers []requester, meta func() *kmsg.MetadataRequest) ([]*kmsg.MetadataResponse, error) {
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Until(dl)/3)
		defer cancel()
	}
	var (
		views   []*kmsg.MetadataResponse
		lastErr = errors.New("no broker known")
		mu      sync.Mutex
		wg      sync.WaitGroup
	)
	for _, b := range brokers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := b.Request(ctx, meta())
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				lastErr = err
				return
			}
			views = append(views, resp.(*kmsg.MetadataResponse))
		}()
	}
	wg.Wait()
	if len(views) == 0 {
		return nil, lastErr
	}
	return views, nil
}

// highestLeaders takes each partition at the highest leader epoch among the brokers' views,
// with the leader that view names; partitions without a leader in that view are left out.
func highestLeaders(views []*kmsg.MetadataResponse) map[tp]leaderAt {
	out := map[tp]leaderAt{}
	for _, v := range views {
		for _, t := range v.Topics {
			if t.Topic == nil || t.ErrorCode != 0 {
				continue
			}
			for _, p := range t.Partitions {
				k := tp{*t.Topic, p.Partition}
				if cur, ok := out[k]; ok && cur.epoch >= p.LeaderEpoch {
					continue
				}
				out[k] = leaderAt{leader: p.Leader, epoch: p.LeaderEpoch}
			}
		}
	}
	for k, l := range out {
		if l.leader < 0 {
			delete(out, k)
		}
	}
	return out
}
