package memfence

import "errors"

// ErrTxDone means a [Tx] was used after Commit or Rollback.
var ErrTxDone = errors.New("memfence: transaction already committed or rolled back")
