package main

import (
	"github.com/batonhq/baton/cmd/baton/internal/bench"
	"github.com/batonhq/baton/fence"
)

// counting returns sink counted for the bench (countingSink), keeping its fence.Topics: a
// consumer compares the topic's identity at every claim only over a sink that implements it,
// so a wrapper that hid it would spare the fenced designs part of their claims.
func counting[Tx any](sink fence.Sink[Tx], rec *bench.Recorder) fence.Sink[Tx] {
	c := &countingSink[Tx]{Sink: sink, rec: rec, pos: map[int32]int64{}}
	if t, ok := sink.(fence.Topics); ok {
		return topicsCounting[Tx]{c, t}
	}
	return c
}

// topicsCounting is a countingSink over a sink that keeps topic identities.
type topicsCounting[Tx any] struct {
	*countingSink[Tx]
	fence.Topics
}
