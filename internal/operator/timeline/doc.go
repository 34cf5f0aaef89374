// Package timeline draws the SVG ownership timeline: per partition a lane of committed batches
// coloured by the writer's token, refused writes as red crosses (ringed when a frozen zombie
// made them), freezes as snowflakes and faults as labelled bands. The chaos harness's report
// (internal/operator/chaos) draws its runs with it from the database after a run, and the live status
// page (internal/status) from what it observed in the last minutes. Standard library only.
package timeline
