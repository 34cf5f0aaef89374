package shard

import "errors"

// ErrMoved means a key does not live on the shard a call reached: its fence there was retired
// because the key moved to another shard (or is being moved), or a transaction of one shard
// was used for a key placed on another. Nothing was written. The router has re-read the
// placement; a claim started afresh reaches the key's shard.
var ErrMoved = errors.New("shard: key moved to another shard")
