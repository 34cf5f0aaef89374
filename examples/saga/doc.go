// Command saga is an order saga on Baton, run under the chaos harness: reserve stock, charge
// the payment, ship; on failure release the stock and refund the payment.
//
//   - The orchestrator is a Baton consumer per order id: each saga's state lives in the
//     database and advances in the fenced transaction, and every step's command leaves through
//     the fenced outbox in that same transaction.
//   - The stock, payment and shipping services are Baton consumers that apply commands
//     through the inbox and reply on their own topics, which the orchestrator consumes
//     (through its inbox too).
//   - Timeouts are records: with every step the orchestrator sends itself a timeout record
//     through the outbox; when it comes due and the saga still waits on that step, the step
//     has timed out. A takeover cannot lose it.
//   - The payment service calls a payment provider that is not idempotent by itself, giving it
//     Baton's idempotency key.
//
// The invariants (no order charged twice, no refund without a charge, no order both shipped
// and refunded, one terminal state per order, every compensation matching a step that ran,
// per-order step order, effects matching outcomes) are checked from the databases alone.
//
//	go run ./examples/saga                          # embedded: kfake and SQLite, a freeze and a kill
//	go run ./examples/saga -unfenced                # the same without Baton: the checker fails it
//	go run ./examples/saga -brokers host:9092 -postgres postgres://...
package main
