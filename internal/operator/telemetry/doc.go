// Package telemetry is the one-call wiring of Baton's metrics out of the process used by the
// baton command and the examples (it is internal because Baton's top level holds only the
// library; an application copies telemetry.go, one file, or wires the same two exporters itself):
// a Prometheus endpoint (go.opentelemetry.io/otel/exporters/prometheus) and, optionally, OTLP
// export over HTTP to a collector. Baton's library packages use only the OpenTelemetry API and
// take a MeterProvider as an option (default the global one); this package builds the SDK
// provider to give them, so it is the one non-cmd package that imports the SDK, and no library
// package imports it.
//
//	m, err := telemetry.New(ctx, telemetry.ServiceName("twin"), telemetry.OTLPFromEnv())
//	if err != nil { ... }
//	defer m.Shutdown(context.Background())
//	otel.SetMeterProvider(m.Provider()) // or consumer.Telemetry(m.Provider(), nil, nil), ...
//	http.Handle("/metrics", m.Handler())
//
// # Metrics Baton emits
//
// The Prometheus names (OTel names with dots as underscores; counters end in _total,
// histograms in _bucket/_sum/_count) and their labels. TestMetricsDocumented scrapes a
// Handler and checks this table; `baton status -http` serves the baton_status_* gauges.
//
//	metric                                     labels
//	baton_consumer_records_applied_total       baton_group, messaging_destination_name, messaging_destination_partition_id
//	baton_consumer_claims_total                baton_group, messaging_destination_name, messaging_destination_partition_id
//	baton_consumer_rebalances_total            baton_group, baton_outcome
//	baton_consumer_apply_duration_seconds      baton_group, messaging_destination_name, messaging_destination_partition_id
//	baton_consumer_lag                         baton_group, messaging_destination_name, messaging_destination_partition_id
//	baton_status_lag                           baton_group, messaging_destination_name, messaging_destination_partition_id
//	baton_status_outbox_backlog                baton_group, messaging_destination_name, messaging_destination_partition_id
//	baton_status_owned                         baton_group, messaging_destination_name, messaging_destination_partition_id
//	baton_status_token_era                     baton_group, messaging_destination_name, messaging_destination_partition_id
//	baton_status_token_epoch                   baton_group, messaging_destination_name, messaging_destination_partition_id
//	baton_status_members                       baton_group
//	baton_status_source_up                     baton_group, baton_source
//	baton_status_recoveries                    baton_group, baton_by
package telemetry
