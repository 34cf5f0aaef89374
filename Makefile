# Baton's front door. 'make demo' runs the demo on embedded defaults (nothing to install);
# 'make test' runs the whole suite against a real Kafka broker and a real PostgreSQL, which it
# installs and starts itself (deploy/local), and stops again if it started them.
SHELL := /bin/bash
GO ?= go
# -race everywhere: the product is about concurrency. -p 1 keeps the real-service tests from
# fighting over 2 cores; packages still run their own tests in parallel.
GOTESTFLAGS ?= -race -count=1 -p 1 -timeout 30m

.PHONY: demo test check lint gotest up down env reset bench

demo:
	$(GO) run ./cmd/baton demo

test:
	deploy/local/with-services.sh $(MAKE) --no-print-directory check

# check assumes the services are up and their variables exported (see 'make env').
check: lint gotest

lint:
	@echo "== gofmt"; out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@echo "== go vet"; $(GO) vet ./...
	@echo "== staticcheck"; $(GO) tool staticcheck ./...

gotest:
	@echo "== go test ($${BATON_KAFKA_BROKERS:-no Kafka}, $${BATON_POSTGRES_URL:+a PostgreSQL})"
	$(GO) test $(GOTESTFLAGS) ./...

bench:
	deploy/local/with-services.sh $(GO) test -run '^$$' -bench . -benchtime 2s ./...

up:
	deploy/local/up.sh

down:
	deploy/local/down.sh

reset:
	deploy/local/down.sh reset

env:
	@deploy/local/env.sh
