package sqlitefence

import "errors"

// ErrBusy means SQLite stayed busy (SQLITE_BUSY: another connection, possibly in another
// process, held the write lock) for longer than the store's [BusyTimeout], or reported busy at a
// point where retrying would have re-run the caller's function. Nothing was committed. The
// driver's own error stays in the chain: errors.Is(err, ErrBusy) and errors.As(err,
// **sqlite.Error) both work.
//
// Unlike [fence.ErrStale], ErrBusy is transient: retrying later is correct.
var ErrBusy = errors.New("sqlitefence: database is busy")
