// Package archtest holds only a test: it enforces the import direction between Baton's packages,
// so the architecture cannot erode silently.
package archtest
