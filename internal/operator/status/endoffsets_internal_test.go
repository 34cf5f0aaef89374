package status

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// silent never answers: a broker cut off from the collector, or paused.
type silent struct{}

func (silent) Request(ctx context.Context, _ kmsg.Request) (kmsg.Response, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// answering answers with its view at once.
type answering struct{ view *kmsg.MetadataResponse }

func (a answering) Request(context.Context, kmsg.Request) (kmsg.Response, error) { return a.view, nil }

// TestViewsPastASilentBroker: a broker that never answers costs a third of the time left, not
// the read: the views of those that answer come back; with none answering, an error.
func TestViewsPastASilentBroker(t *testing.T) {
	view := kmsg.NewPtrMetadataResponse()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	views, err := viewsOf(ctx, []requester{silent{}, answering{view}, silent{}}, kmsg.NewPtrMetadataRequest())
	took := time.Since(start)
	if err != nil || len(views) != 1 || views[0] != view {
		t.Fatalf("views %v, %v; want the answering broker's", views, err)
	}
	if took > 1500*time.Millisecond {
		t.Errorf("took %v of a 3s deadline; want about a third of it (a silent broker must not hold the read)", took)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if views, err := viewsOf(ctx2, []requester{silent{}}, kmsg.NewPtrMetadataRequest()); err == nil {
		t.Errorf("no broker answered, yet %d views and no error", len(views))
	}
	if _, err := viewsOf(context.Background(), nil, kmsg.NewPtrMetadataRequest()); err == nil {
		t.Error("no broker known, yet no error")
	}
}
