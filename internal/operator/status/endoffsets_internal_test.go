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
	views, err := viewsOf(ctx, []requester{silent{}, answering{view}, silent{}}, kmsg.NewPtrMetadataRequest)
	took := time.Since(start)
	if err != nil || len(views) != 1 || views[0] != view {
		t.Fatalf("views %v, %v; want the answering broker's", views, err)
	}
	if took > 1500*time.Millisecond {
		t.Errorf("took %v of a 3s deadline; want about a third of it (a silent broker must not hold the read)", took)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if views, err := viewsOf(ctx2, []requester{silent{}}, kmsg.NewPtrMetadataRequest); err == nil {
		t.Errorf("no broker answered, yet %d views and no error", len(views))
	}
	if _, err := viewsOf(context.Background(), nil, kmsg.NewPtrMetadataRequest); err == nil {
		t.Error("no broker known, yet no error")
	}
}

// recording answers at once and keeps the request it was given.
type recording struct {
	view *kmsg.MetadataResponse
	got  chan kmsg.Request
}

func (r recording) Request(_ context.Context, req kmsg.Request) (kmsg.Response, error) {
	r.got <- req
	return r.view, nil
}

// TestViewsAskEachBrokerItsOwnRequest: the client writes the version it negotiated into the
// request it sends, so brokers asked at once must not share one request.
func TestViewsAskEachBrokerItsOwnRequest(t *testing.T) {
	got := make(chan kmsg.Request, 3)
	b := recording{kmsg.NewPtrMetadataResponse(), got}
	if _, err := viewsOf(context.Background(), []requester{b, b, b}, kmsg.NewPtrMetadataRequest); err != nil {
		t.Fatal(err)
	}
	close(got)
	seen := map[kmsg.Request]bool{}
	for req := range got {
		if seen[req] {
			t.Fatalf("two brokers were asked with the same request %p", req)
		}
		seen[req] = true
	}
	if len(seen) != 3 {
		t.Fatalf("%d requests sent, want 3", len(seen))
	}
}
