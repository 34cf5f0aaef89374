package chaos

import "errors"

// ErrUsage marks a worker command line RunWorker cannot run (an unknown flag, a bad value, a
// missing database): the command that called RunWorker should exit with status 2.
var ErrUsage = errors.New("chaos: bad worker command line")
