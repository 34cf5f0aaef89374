// Package testenv gives tests the services they need: a Kafka (in-process kfake, or the real
// broker named by BATON_KAFKA_BROKERS) and a PostgreSQL (named by BATON_POSTGRES_URL), each test
// with its own topics and its own schema so tests run in parallel without seeing each other's data.
// A Redis is named by BATON_REDIS_ADDR ([RedisAddr]; shared: tests keep to key prefixes of their
// own), or started for the test alone by [StartRedis], which the test may kill and restart.
//
// The secure services (BATON_SECURE=1 deploy/local: the broker's SASL_SSL listener with the ACL
// authorizer, a TLS-only PostgreSQL with a migration and a runtime role) come through
// [SecureKafka] (client options of the least-privilege runtime principal and of an admin; topics
// and groups the runtime principal is granted exactly its ACLs on) and [SecurePostgres] (a schema
// owned by the migration role, a pool per role). [Secrets] and [NoSecrets] check captured output
// for the passwords; [MakeBadCerts] makes the certificates of the failure cases.
//
// Locally a missing real service skips the test with the command that starts it. When the CI
// environment variable is set, a missing service fails the test: in CI nothing skips.
package testenv
