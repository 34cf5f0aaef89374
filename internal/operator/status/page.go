package status

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/operator/timeline"
)

//go:embed page.html
var pageFS embed.FS

var pageTmpl = template.Must(template.New("page.html").Funcs(template.FuncMap{
	"num":   num,
	"dash":  orDash,
	"ms":    func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"clock": func(t time.Time) string { return t.Local().Format("15:04:05") },
}).ParseFS(pageFS, "page.html"))

// PageOption configures a [Page].
type PageOption func(*pageConfig) error

type pageConfig struct {
	interval time.Duration
	window   time.Duration
	metrics  http.Handler
	meter    metric.MeterProvider
}

// Interval sets how often the page reads the sources and the browser refreshes (default 2s).
func Interval(d time.Duration) PageOption {
	return func(c *pageConfig) error {
		if d < 100*time.Millisecond {
			return errorf(ErrUsage, "interval %s is below 100ms", d)
		}
		c.interval = d
		return nil
	}
}

// Window sets how far back the charts and the timeline reach (default 10m).
func Window(d time.Duration) PageOption {
	return func(c *pageConfig) error {
		if d < time.Second {
			return errorf(ErrUsage, "window %s is below 1s", d)
		}
		c.window = d
		return nil
	}
}

// Metrics sets the handler served at /metrics (e.g. a Prometheus exporter's). Default: none
// (404).
func Metrics(h http.Handler) PageOption {
	return func(c *pageConfig) error {
		if h == nil {
			return errorf(ErrUsage, "nil metrics handler")
		}
		c.metrics = h
		return nil
	}
}

// MeterProvider sets where the page records the group's state as gauges (default the global
// provider): see the package documentation for the names.
func MeterProvider(mp metric.MeterProvider) PageOption {
	return func(c *pageConfig) error {
		if mp == nil {
			return errorf(ErrUsage, "nil meter provider")
		}
		c.meter = mp
		return nil
	}
}

// sample is one read of one partition.
type sample struct {
	at       time.Time
	lag      *int64
	backlog  *int64
	token    string
	position *int64
	owner    string
}

// Event is something the page saw happen: a takeover (the stored token changed), a recovery,
// a source becoming unreachable.
type Event struct {
	At   time.Time `json:"at"`
	Kind string    `json:"kind"`
	Text string    `json:"text"`
	// Partition and Fenced: after a takeover, handover, regression or recovery, the store
	// refuses every write of that partition presented with Fenced or an older token.
	Partition string `json:"partition,omitempty"`
	Fenced    string `json:"fenced,omitempty"`
}

// Page is the live status page of one group. Run polls the sources; ServeHTTP serves / (the
// HTML page, refreshing itself), /timeline.svg, /status.json and /metrics.
type Page struct {
	c   *Collector
	cfg pageConfig

	mu      sync.Mutex
	snap    *Snapshot
	snapErr error
	renders []time.Duration
	hist    map[fence.Key][]sample
	events  []Event
	seenRec int
	reg     metric.Registration
}

// NewPage returns the page of c's group. It does no I/O; Run starts reading.
func NewPage(c *Collector, opts ...PageOption) (*Page, error) {
	cfg := pageConfig{interval: 2 * time.Second, window: 10 * time.Minute}
	var errs []error
	if c == nil {
		errs = append(errs, errorf(ErrUsage, "nil collector"))
	}
	for i, o := range opts {
		if o == nil {
			errs = append(errs, errorf(ErrUsage, "page option %d is nil", i))
			continue
		}
		errs = append(errs, o(&cfg))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.meter == nil {
		cfg.meter = otel.GetMeterProvider()
	}
	p := &Page{c: c, cfg: cfg, hist: map[fence.Key][]sample{}, seenRec: -1}
	if err := p.instruments(); err != nil {
		return nil, err
	}
	return p, nil
}

// instruments registers the page's gauges, observed from the latest snapshot.
func (p *Page) instruments() error {
	m := p.cfg.meter.Meter("github.com/batonhq/baton/internal/operator/status")
	lag, e1 := m.Int64ObservableGauge("baton.status.lag", metric.WithDescription("records produced and not yet applied, per partition (high watermark - (sink position + 1))"))
	backlog, e2 := m.Int64ObservableGauge("baton.status.outbox_backlog", metric.WithDescription("outbox rows appended and not yet delivered, per source partition"))
	owned, e3 := m.Int64ObservableGauge("baton.status.owned", metric.WithDescription("1 if a live member owns the partition, else 0"))
	era, e4 := m.Int64ObservableGauge("baton.status.token.era", metric.WithDescription("the era of the fence's stored token"))
	epoch, e5 := m.Int64ObservableGauge("baton.status.token.epoch", metric.WithDescription("the epoch of the fence's stored token"))
	members, e6 := m.Int64ObservableGauge("baton.status.members", metric.WithDescription("live members of the group"))
	up, e7 := m.Int64ObservableGauge("baton.status.source_up", metric.WithDescription("1 if the source (kafka, store, or a sharded sink's \"shard NAME\") answered the last read, else 0"))
	recs, e8 := m.Int64ObservableGauge("baton.status.recoveries", metric.WithDescription("recorded recoveries of the group, by who made them (consumer, operator)"))
	if err := errors.Join(e1, e2, e3, e4, e5, e6, e7, e8); err != nil {
		return err
	}
	group := attribute.String("baton.group", p.c.cfg.Group)
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		p.mu.Lock()
		s := p.snap
		p.mu.Unlock()
		if s == nil {
			return nil
		}
		for _, src := range s.Sources {
			o.ObserveInt64(up, b2i(src.Err == ""), metric.WithAttributes(group, attribute.String("baton.source", src.Name)))
		}
		o.ObserveInt64(members, int64(len(s.Members)), metric.WithAttributes(group))
		auto := int64(s.Summary.Regressions + s.Summary.Handovers)
		o.ObserveInt64(recs, auto, metric.WithAttributes(group, attribute.String("baton.by", "consumer")))
		o.ObserveInt64(recs, int64(s.Summary.Recoveries)-auto, metric.WithAttributes(group, attribute.String("baton.by", "operator")))
		for _, l := range s.Partitions {
			attrs := metric.WithAttributes(group, attribute.String("messaging.destination.name", l.Topic),
				attribute.Int("messaging.destination.partition.id", int(l.Partition)))
			if l.Lag != nil {
				o.ObserveInt64(lag, *l.Lag, attrs)
			}
			if l.Backlog != nil {
				o.ObserveInt64(backlog, *l.Backlog, attrs)
			}
			o.ObserveInt64(owned, b2i(l.Owner != nil), attrs)
			if t, err := fence.ParseToken(l.Token); err == nil && l.Token != "" {
				o.ObserveInt64(era, t.Era, attrs)
				o.ObserveInt64(epoch, t.Epoch, attrs)
			}
		}
		return nil
	}, lag, backlog, owned, era, epoch, members, up, recs)
	p.reg = reg
	return err
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Run reads the sources every interval until ctx ends, and returns nil then.
func (p *Page) Run(ctx context.Context) error {
	defer func() {
		if p.reg != nil {
			_ = p.reg.Unregister()
		}
	}()
	t := time.NewTicker(p.cfg.interval)
	defer t.Stop()
	for {
		p.Poll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Poll reads the sources once and records the result.
func (p *Page) Poll(ctx context.Context) {
	snap, err := p.c.Collect(ctx)
	if ctx.Err() != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.record(snap, err)
}

func (p *Page) record(snap *Snapshot, err error) {
	now := snap.At
	if p.snap != nil {
		for i, src := range snap.Sources {
			if i < len(p.snap.Sources) && src.Err != "" && p.snap.Sources[i].Err == "" {
				p.event(now, "unreachable", src.Name+" ("+src.Addr+") stopped answering: "+src.Err)
			}
			if i < len(p.snap.Sources) && src.Err == "" && p.snap.Sources[i].Err != "" {
				p.event(now, "reachable", src.Name+" ("+src.Addr+") answers again")
			}
		}
	}
	p.snap, p.snapErr = snap, err
	for _, l := range snap.Partitions {
		k := fence.Key{Group: snap.Group, Topic: l.Topic, Partition: l.Partition}
		h := p.hist[k]
		s := sample{at: now, lag: l.Lag, backlog: l.Backlog, token: l.Token, position: l.Position, owner: l.Owner.String()}
		if n := len(h); n > 0 && h[n-1].token != "" && s.token != "" && h[n-1].token != s.token {
			// The previous owner: the last one seen (the partition may have been unowned for a
			// read or two in between).
			prev := "-"
			for i := n - 1; i >= 0 && prev == "-"; i-- {
				prev = h[i].owner
			}
			p.eventFenced(now, "takeover", fmt.Sprintf("%s/%d: token %s -> %s, owner %s -> %s", l.Topic, l.Partition, h[n-1].token, s.token, prev, s.owner),
				fmt.Sprintf("%s/%d", l.Topic, l.Partition), h[n-1].token)
		}
		h = append(h, s)
		cut := now.Add(-p.cfg.window)
		i := 0
		for i < len(h) && h[i].at.Before(cut) {
			i++
		}
		p.hist[k] = h[i:]
	}
	// Recoveries: report those recorded since the page started (and the last few before).
	if p.seenRec < 0 {
		p.seenRec = max(0, len(snap.Recoveries)-5)
	}
	for _, r := range snap.Recoveries[min(p.seenRec, len(snap.Recoveries)):] {
		kind := "recovery"
		if r.Kind != KindOperator {
			kind = r.Kind
		}
		p.eventFenced(r.At, kind, fmt.Sprintf("%s/%d: era advanced %s -> %s: %s", r.Topic, r.Partition, r.From, r.To, r.Reason),
			fmt.Sprintf("%s/%d", r.Topic, r.Partition), r.From)
	}
	storesRead := true
	for _, src := range snap.Sources[1:] {
		storesRead = storesRead && src.Err == ""
	}
	if len(snap.Recoveries) > 0 || storesRead {
		p.seenRec = max(p.seenRec, len(snap.Recoveries))
	}
}

func (p *Page) event(at time.Time, kind, text string) { p.eventFenced(at, kind, text, "", "") }

// eventFenced records an event after which the partition's writes with token fenced (and
// older) are refused.
func (p *Page) eventFenced(at time.Time, kind, text, partition, fenced string) {
	p.events = append(p.events, Event{At: at, Kind: kind, Text: text, Partition: partition, Fenced: fenced})
	if len(p.events) > 50 {
		p.events = p.events[len(p.events)-50:]
	}
}

// Snapshot returns the latest snapshot and its error (nil before the first read).
func (p *Page) Snapshot() (*Snapshot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.snap, p.snapErr
}

// Events returns what the page saw happen, oldest first.
func (p *Page) Events() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.events)
}

// RenderTimes returns how long the last renders of / took on the server (at most 100).
func (p *Page) RenderTimes() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.renders)
}

type pageRow struct {
	Partition
	Owner        string
	LagChart     template.HTML
	BacklogChart template.HTML
	RecoveryText string
	Unowned      bool
}

type pageData struct {
	Group     string
	State     string
	Refresh   int
	Snap      *Snapshot
	Err       string
	Rows      []pageRow
	Events    []Event
	Timeline  template.HTML
	Window    string
	Rendered  string
	HasMetric bool
}

// ServeHTTP serves the page.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/":
		p.serveHTML(w)
	case "/timeline.svg":
		p.mu.Lock()
		var buf bytes.Buffer
		err := p.timeline(&buf)
		p.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "image/svg+xml")
		_, _ = w.Write(buf.Bytes())
	case "/status.json":
		s, err := p.Snapshot()
		w.Header().Set("Content-Type", "application/json")
		v := struct {
			*Snapshot
			Error  string  `json:"error,omitempty"`
			Events []Event `json:"events"`
		}{Snapshot: s, Events: p.Events()}
		if err != nil {
			v.Error = err.Error()
		}
		_ = WriteJSON(w, v)
	case "/metrics":
		if p.cfg.metrics == nil {
			http.NotFound(w, r)
			return
		}
		p.cfg.metrics.ServeHTTP(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (p *Page) serveHTML(w http.ResponseWriter) {
	start := time.Now()
	p.mu.Lock()
	d := pageData{Group: p.c.cfg.Group, Refresh: max(1, int(p.cfg.interval.Round(time.Second)/time.Second)), Snap: p.snap,
		Window: p.cfg.window.String(), HasMetric: p.cfg.metrics != nil}
	if p.snapErr != nil {
		d.Err = p.snapErr.Error()
	}
	d.Events = slices.Clone(p.events)
	slices.Reverse(d.Events)
	if p.snap != nil {
		d.State = p.snap.GroupState
		for _, l := range p.snap.Partitions {
			h := p.hist[fence.Key{Group: p.snap.Group, Topic: l.Topic, Partition: l.Partition}]
			row := pageRow{Partition: l, Owner: l.Owner.String(), Unowned: l.Owner == nil,
				LagChart:     sparkline(h, func(s sample) *int64 { return s.lag }, "#4e79a7", p.cfg.window),
				BacklogChart: sparkline(h, func(s sample) *int64 { return s.backlog }, "#f28e2b", p.cfg.window)}
			if r := l.LastRecovery; r != nil {
				row.RecoveryText = fmt.Sprintf("%s→%s %s %s", r.From, r.To, r.Kind, r.At.Local().Format("Jan 2 15:04:05"))
			}
			d.Rows = append(d.Rows, row)
		}
		var buf bytes.Buffer
		if err := p.timeline(&buf); err == nil {
			d.Timeline = template.HTML(buf.String()) // our own SVG, every text in it escaped
		}
	}
	p.mu.Unlock()
	var out bytes.Buffer
	if err := pageTmpl.Execute(&out, d); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(out.Bytes())
	p.mu.Lock()
	p.renders = append(p.renders, time.Since(start))
	if len(p.renders) > 100 {
		p.renders = p.renders[1:]
	}
	p.mu.Unlock()
}

// timeline draws the ownership timeline of the window from the samples (p.mu held): a tick
// where a fence's position advanced between two reads, coloured by the token it advanced
// under; takeovers and recoveries as bands.
func (p *Page) timeline(buf *bytes.Buffer) error {
	if p.snap == nil {
		return errors.New("no read yet")
	}
	now := p.snap.At
	t := timeline.Timeline{
		Title:   fmt.Sprintf("Group %s: who wrote each partition since %s (at most the last %s)", p.snap.Group, p.since(now).Local().Format("15:04:05"), p.cfg.window),
		Caption: "Each lane is a partition; a tick is progress of the fence between two reads, coloured by the token (era.epoch) it was written under; bands are takeovers and recoveries.",
		FromMS:  p.since(now).UnixMilli(),
		ToMS:    now.UnixMilli(),
	}
	lane := map[fence.Key]int32{}
	for _, l := range p.snap.Partitions {
		k := fence.Key{Group: p.snap.Group, Topic: l.Topic, Partition: l.Partition}
		lane[k] = int32(len(t.LaneLabels))
		t.LaneLabels = append(t.LaneLabels, fmt.Sprintf("%s/%d", clipLabel(l.Topic, 9), l.Partition))
	}
	t.Lanes = len(t.LaneLabels)
	for k, h := range p.hist {
		ln, ok := lane[k]
		if !ok {
			continue
		}
		for i := 1; i < len(h); i++ {
			a, b := h[i-1], h[i]
			if a.position == nil || b.position == nil || *b.position <= *a.position {
				continue
			}
			tok, err := fence.ParseToken(b.token)
			if err != nil {
				continue
			}
			t.Batches = append(t.Batches, timeline.Batch{Lane: ln, AtMS: b.at.UnixMilli(), Era: tok.Era, Epoch: tok.Epoch, Who: b.owner, Count: int(*b.position - *a.position)})
		}
	}
	slices.SortFunc(t.Batches, func(a, b timeline.Batch) int { return int(a.AtMS - b.AtMS) })
	var bands []timeline.Band
	for _, e := range p.events {
		if e.At.Before(now.Add(-p.cfg.window)) || (e.Kind != "takeover" && e.Kind != "recovery" && e.Kind != "regression" && e.Kind != "handover") {
			continue
		}
		bands = append(bands, timeline.Band{StartMS: e.At.UnixMilli() - p.cfg.interval.Milliseconds(), EndMS: e.At.UnixMilli(), Label: e.Kind + " " + e.Text})
	}
	if len(bands) > 8 {
		bands = bands[len(bands)-8:]
	}
	t.Bands = bands
	return timeline.Write(buf, t)
}

// since is where the timeline starts: the window back from now, or the first read if later
// (p.mu held).
func (p *Page) since(now time.Time) time.Time {
	from := now.Add(-p.cfg.window)
	first := now
	for _, h := range p.hist {
		if len(h) > 0 && h[0].at.Before(first) {
			first = h[0].at
		}
	}
	if first.After(from) {
		from = first.Add(-p.cfg.interval)
	}
	return from
}

func clipLabel(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// sparkline draws a small SVG line chart of one value over the window.
func sparkline(h []sample, v func(sample) *int64, colour string, window time.Duration) template.HTML {
	const w, ht = 160, 28
	if len(h) == 0 {
		return ""
	}
	now := h[len(h)-1].at
	// The x axis spans what was observed, up to the window: a page started a minute ago draws
	// that minute across the whole chart.
	window = min(window, max(now.Sub(h[0].at), 10*time.Second))
	var hi int64 = 1
	for _, s := range h {
		if x := v(s); x != nil && *x > hi {
			hi = *x
		}
	}
	var pts []string
	for _, s := range h {
		x := v(s)
		if x == nil {
			continue
		}
		px := float64(w) - float64(now.Sub(s.at))/float64(window)*float64(w)
		py := float64(ht-2) - float64(*x)/float64(hi)*float64(ht-4)
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
	}
	last := "?"
	if x := v(h[len(h)-1]); x != nil {
		last = fmt.Sprint(*x)
	}
	return template.HTML(fmt.Sprintf(`<svg class="spark" width="%d" height="%d" viewBox="0 0 %d %d"><title>last %s: now %s, max %d</title><polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/></svg>`,
		w, ht, w, ht, window, last, hi, colour, strings.Join(pts, " ")))
}

// ListenAndServe serves the page on addr and polls the sources until ctx ends; then it shuts
// the server down and returns nil. ready, if not nil, is called with the address listened on
// (useful with port 0).
func (p *Page) ListenAndServe(ctx context.Context, addr string, ready func(addr string)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("status page: listening on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = p.Run(ctx)
	}()
	if ready != nil {
		ready(ln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
	case err = <-errc:
		cancel()
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = srv.Shutdown(sctx)
	scancel()
	if err == nil {
		err = <-errc
	}
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
