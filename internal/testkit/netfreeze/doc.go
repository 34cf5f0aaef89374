// Package netfreeze is test plumbing: a dialer whose connections can be frozen, so a Kafka
// client (kgo.Dialer) stops moving bytes as a paused process or a network partition would,
// while the rest of the test process keeps running. Reads and writes block while frozen;
// bytes that arrived meanwhile are delivered after the thaw, like packets queued in a link.
package netfreeze
