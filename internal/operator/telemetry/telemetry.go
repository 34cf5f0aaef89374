package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// Option configures [New].
type Option func(*config) error

type config struct {
	service      string
	otlp         bool
	grpc         bool   // with otlp: OTLP/gRPC instead of OTLP/HTTP
	otlpEndpoint string // "" with otlp: the OTEL_EXPORTER_OTLP_* environment variables
	interval     time.Duration
}

// ServiceName sets the service.name resource attribute (default "baton").
func ServiceName(name string) Option {
	return func(c *config) error {
		if name == "" {
			return errors.New("telemetry: empty service name")
		}
		c.service = name
		return nil
	}
}

// OTLP also exports every metric over OTLP/HTTP to endpoint (host:port, no scheme; plain
// HTTP, as to a collector beside the process). Default: no OTLP export.
func OTLP(endpoint string) Option {
	return func(c *config) error {
		if endpoint == "" {
			return errors.New("telemetry: empty OTLP endpoint")
		}
		c.otlp, c.grpc, c.otlpEndpoint = true, false, endpoint
		return nil
	}
}

// OTLPFromEnv exports over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set, configured by the standard OTEL_EXPORTER_OTLP_*
// variables, over the protocol OTEL_EXPORTER_OTLP_METRICS_PROTOCOL or
// OTEL_EXPORTER_OTLP_PROTOCOL names: grpc or http/protobuf (the default, as the OpenTelemetry
// specification says); any other protocol is an error. Without an endpoint it does nothing.
func OTLPFromEnv() Option {
	return func(c *config) error {
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") == "" {
			return nil
		}
		p, err := OTLPProtocol("METRICS")
		if err != nil {
			return err
		}
		c.otlp, c.grpc = true, p == "grpc"
		return nil
	}
}

// OTLPProtocol returns the OTLP protocol the environment asks for a signal ("TRACES",
// "METRICS"): OTEL_EXPORTER_OTLP_<signal>_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, else
// "http/protobuf". It returns an error for a protocol other than grpc and http/protobuf.
func OTLPProtocol(signal string) (string, error) {
	name := "OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL"
	p := os.Getenv(name)
	if p == "" {
		name = "OTEL_EXPORTER_OTLP_PROTOCOL"
		p = os.Getenv(name)
	}
	switch p {
	case "":
		return "http/protobuf", nil
	case "grpc", "http/protobuf":
		return p, nil
	}
	return "", fmt.Errorf("telemetry: %s=%s: only grpc and http/protobuf are supported", name, p)
}

// ExportInterval sets how often metrics are pushed over OTLP (default 10s).
func ExportInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("telemetry: export interval %s is not positive", d)
		}
		c.interval = d
		return nil
	}
}

// Metrics is a meter provider exporting to Prometheus and, if asked, OTLP.
type Metrics struct {
	provider *sdkmetric.MeterProvider
	handler  http.Handler
}

// New builds the provider. It does no network I/O: the Prometheus endpoint is served by
// [Metrics.Handler], and the OTLP exporter connects on its first push.
func New(ctx context.Context, opts ...Option) (*Metrics, error) {
	c := config{service: "baton", interval: 10 * time.Second}
	var errs []error
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("telemetry: option %d is nil", i))
			continue
		}
		errs = append(errs, o(&c))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	// The process's own series beside Baton's: go_* (runtime and GC), process_* (CPU, memory,
	// file descriptors, start time) and go_build_info (the binary's module versions).
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector())
	// Without the otel_scope_* labels on every series: each metric name already says which
	// package records it, and the extra labels only break joins between series.
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(c.service)))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	popts := []sdkmetric.Option{sdkmetric.WithReader(exp), sdkmetric.WithResource(res)}
	if c.otlp {
		var oexp sdkmetric.Exporter
		if c.grpc {
			oexp, err = otlpmetricgrpc.New(ctx) // connects lazily; configured by OTEL_EXPORTER_OTLP_*
		} else {
			var eopts []otlpmetrichttp.Option
			if c.otlpEndpoint != "" {
				eopts = append(eopts, otlpmetrichttp.WithEndpoint(c.otlpEndpoint), otlpmetrichttp.WithInsecure())
			}
			oexp, err = otlpmetrichttp.New(ctx, eopts...)
		}
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
		}
		popts = append(popts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(oexp, sdkmetric.WithInterval(c.interval))))
	}
	return &Metrics{
		provider: sdkmetric.NewMeterProvider(popts...),
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true}),
	}, nil
}

// Provider returns the meter provider to give Baton's packages (or otel.SetMeterProvider).
func (m *Metrics) Provider() *sdkmetric.MeterProvider { return m.provider }

// Handler serves the metrics in the Prometheus text format, or in OpenMetrics to a scraper that
// asks for it, which then also gets the histograms' exemplars (the trace of a recorded batch)
// (mount it at /metrics).
func (m *Metrics) Handler() http.Handler { return m.handler }

// Shutdown flushes the OTLP exporter (if any) and stops the provider.
func (m *Metrics) Shutdown(ctx context.Context) error { return m.provider.Shutdown(ctx) }

// NewLogger returns a logger writing to w in format "text" (slog's key=value lines) or "json"
// (one object per line, for a log pipeline), at level "debug", "info", "warn" or "error". An
// empty format or level means text or info.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	lv := slog.LevelInfo
	if level != "" {
		if err := lv.UnmarshalText([]byte(level)); err != nil {
			return nil, fmt.Errorf("telemetry: log level %q: want debug, info, warn or error", level)
		}
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("telemetry: log format %q: want text or json", format)
}
