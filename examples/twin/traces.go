package main

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracesFromEnv builds a member's tracer provider from the standard OpenTelemetry variables:
// with OTEL_TRACES_EXPORTER=otlp (or unset, with OTEL_EXPORTER_OTLP_ENDPOINT set) spans go
// over OTLP to the collector the OTEL_EXPORTER_OTLP_* variables name (the exporter reads
// endpoint and timeout itself), over the protocol OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or
// OTEL_EXPORTER_OTLP_PROTOCOL names: grpc, or http/protobuf (the default, as the OpenTelemetry
// specification says, and as 'baton status' and 'baton audit' export metrics); otherwise no
// spans are exported. The returned shutdown flushes
// what is buffered, within the exporter's timeout (part of the shutdown budget,
// deploy/README.md).
func tracesFromEnv(ctx context.Context, service string) (trace.TracerProvider, func(context.Context) error, error) {
	none := func(context.Context) error { return nil }
	switch exp := os.Getenv("OTEL_TRACES_EXPORTER"); {
	case exp == "none", exp == "" && os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "":
		return noop.NewTracerProvider(), none, nil
	case exp != "" && exp != "otlp":
		return nil, nil, fmt.Errorf("%w: OTEL_TRACES_EXPORTER=%s: only otlp and none are supported", errUsage, exp)
	}
	name := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	p := os.Getenv(name)
	if p == "" {
		name = "OTEL_EXPORTER_OTLP_PROTOCOL"
		p = os.Getenv(name)
	}
	var exp sdktrace.SpanExporter
	var err error
	switch p {
	case "grpc":
		exp, err = otlptracegrpc.New(ctx) // connects lazily; configured by OTEL_EXPORTER_OTLP_*
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	default:
		return nil, nil, fmt.Errorf("%w: %s=%s: only grpc and http/protobuf are supported", errUsage, name, p)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}
