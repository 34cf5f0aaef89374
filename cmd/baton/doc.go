// Command baton is Baton's command line: the demo, chaos runs, and the worker process the
// chaos harness starts.
//
//	baton demo     the digital-twin demo on embedded defaults (in-process Kafka, SQLite)
//	baton chaos    a chaos run against real services, with a verdict and an HTML report
//	baton worker   one chaos worker process (started by 'baton chaos' and 'baton demo'; its
//	               flags are internal/operator/chaos's, see chaos.RunWorker)
package main
