// Package timeline draws a run's SVG drawings. Write draws the ownership timeline: per
// partition a lane of committed batches coloured by the writer's token, refused writes as red
// crosses (ringed when a frozen zombie made them), freezes as snowflakes and faults as bands,
// either shading the lanes with their labels listed below or, for runs with many, as a strip of
// bars above the lanes whose tooltips and links carry the labels. WriteSummary draws counts per
// time step, a stacked bar per step and row, at a fixed width whatever the run's length.
//
// The chaos harness's report (internal/operator/chaos) draws its runs with both from the
// database after a run, and the live status page (internal/status) its timeline from what it
// observed in the last minutes. Standard library only.
package timeline
