package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
		c.otlp, c.otlpEndpoint = true, endpoint
		return nil
	}
}

// OTLPFromEnv exports over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set, configured by the standard OTEL_EXPORTER_OTLP_*
// variables; otherwise it does nothing.
func OTLPFromEnv() Option {
	return func(c *config) error {
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != "" {
			c.otlp = true
		}
		return nil
	}
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
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(c.service)))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	popts := []sdkmetric.Option{sdkmetric.WithReader(exp), sdkmetric.WithResource(res)}
	if c.otlp {
		var eopts []otlpmetrichttp.Option
		if c.otlpEndpoint != "" {
			eopts = append(eopts, otlpmetrichttp.WithEndpoint(c.otlpEndpoint), otlpmetrichttp.WithInsecure())
		}
		oexp, err := otlpmetrichttp.New(ctx, eopts...)
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
		}
		popts = append(popts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(oexp, sdkmetric.WithInterval(c.interval))))
	}
	return &Metrics{
		provider: sdkmetric.NewMeterProvider(popts...),
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}, nil
}

// Provider returns the meter provider to give Baton's packages (or otel.SetMeterProvider).
func (m *Metrics) Provider() *sdkmetric.MeterProvider { return m.provider }

// Handler serves the metrics in the Prometheus text format (mount it at /metrics).
func (m *Metrics) Handler() http.Handler { return m.handler }

// Shutdown flushes the OTLP exporter (if any) and stops the provider.
func (m *Metrics) Shutdown(ctx context.Context) error { return m.provider.Shutdown(ctx) }
