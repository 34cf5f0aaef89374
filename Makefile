# Baton's front door. Needs Go and make, nothing else:
#   'make demo' runs the demo on embedded defaults (in-process Kafka, an SQLite file);
#   'make test' runs the whole suite against a real Kafka broker and a real PostgreSQL. On a fresh
#   Debian/Ubuntu machine it first installs what is missing from Debian's packages with apt-get
#   (as root, or through sudo): PostgreSQL, Redis, a Java 17+ runtime and Maven; Maven fetches
#   Kafka's jars from Maven Central once. It then starts the services (deploy/local), and stops
#   again those it started. When everything is there the check costs a fraction of a second.
# 'make help' lists the targets.
SHELL := /bin/bash
GO ?= go
# -race everywhere: the product is about concurrency. -p 1 keeps the real-service tests from
# fighting over 2 cores; packages still run their own tests in parallel.
GOTESTFLAGS ?= -race -count=1 -p 1 -timeout 30m

.PHONY: demo test check lint gotest fuzz up down env reset bench deps help

demo:
	$(GO) run ./cmd/baton demo

test:
	deploy/local/with-services.sh $(MAKE) --no-print-directory check

# check assumes the services are up and their variables exported (see 'make env').
check: lint gotest fuzz

lint:
	@echo "== gofmt"; out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@echo "== go vet"; $(GO) vet ./...
	@echo "== staticcheck"; $(GO) tool staticcheck ./...
	@echo "== deploy/local install logic (dry run)"; deploy/local/install-test.sh

gotest:
	@echo "== go test ($${BATON_KAFKA_BROKERS:-no Kafka}, $${BATON_POSTGRES_URL:+a PostgreSQL})"
	$(GO) test $(GOTESTFLAGS) ./...

# fuzz runs every fuzzer for FUZZTIME (bounded; the seed corpora also run in every go test).
FUZZTIME ?= 3s
FUZZERS := ./fence:FuzzParseToken ./fence:FuzzUnmarshalBinary ./outbox:FuzzParseEnvelope \
	./outbox:FuzzInboxAdmit ./outbox/outboxstore:FuzzUnmarshalHeaders ./consumer:FuzzDeadLetterHeaders
fuzz:
	@echo "== fuzz ($(FUZZTIME) each)"
	@for f in $(FUZZERS); do \
		$(GO) test -run '^$$' -fuzz "^$${f#*:}$$" -fuzztime $(FUZZTIME) "$${f%%:*}" || exit 1; \
	done

bench:
	deploy/local/with-services.sh $(GO) test -run '^$$' -bench . -benchtime 2s ./...

# deps installs what 'make test' needs (apt-get, once) without starting anything: for building
# a CI image. BATON_DRY_RUN=1 make deps only says what it would install.
deps:
	deploy/local/postgres.sh install
	deploy/local/redis.sh install
	deploy/local/kafka.sh install
	deploy/local/kafka.sh fetch

up:
	deploy/local/up.sh

down:
	deploy/local/down.sh

reset:
	deploy/local/down.sh reset

env:
	@deploy/local/env.sh

help:
	@echo "make demo    the demo on embedded defaults (in-process Kafka, SQLite): nothing to install"
	@echo "make test    gofmt, go vet, staticcheck and 'go test -race ./...' against a real Kafka and"
	@echo "             PostgreSQL; installs (apt-get) and starts them first, stops what it started"
	@echo "make deps    only install what 'make test' needs (PostgreSQL, Redis, Java 17+, Maven, Kafka's jars)"
	@echo "make up      start PostgreSQL, Kafka and Redis and keep them running; 'eval \"\$$(make -s env)\"'"
	@echo "             exports their addresses, then 'make check' runs lint and tests against them"
	@echo "make down    stop them ('make reset' also deletes their data)"
	@echo "make bench   the benchmarks against the real services"
	@echo "make fuzz    every fuzzer for FUZZTIME (default 3s) each; 'make check' runs it"
	@echo "BATON_SECURE=1 make test|up|env: also the secure services (SASL_SSL + ACLs, TLS-only PostgreSQL"
	@echo "             with a least-privilege runtime role) for the secure tests"
	@echo "BATON_DRY_RUN=1 make deps|test: say what would be installed, install and run nothing"
