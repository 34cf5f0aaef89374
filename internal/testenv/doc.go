// Package testenv gives tests the services they need: a Kafka (in-process kfake, or the real
// broker named by BATON_KAFKA_BROKERS) and a PostgreSQL (named by BATON_POSTGRES_URL), each test
// with its own topics and its own schema so tests run in parallel without seeing each other's data.
//
// Locally a missing real service skips the test with the command that starts it. When the CI
// environment variable is set, a missing service fails the test: in CI nothing skips.
package testenv
