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

.PHONY: demo test test-lane-a test-lane-b test-lane-c test-lane-d gotest-main gotest-consumer gotest-chaos gotest-faults gotest-sample test-kip848 outside ci check lint gotest mutants mutants-safety fuzz up down env reset bench bench-smoke gobench deps help

demo:
	$(GO) run ./cmd/baton demo

# test is the README's test command and what .ci/run runs: lint, every test, the safety-critical
# mutants, the bench's smoke run (every design's fold checked), the KIP-848 run and the
# outside-module check. It runs in four lanes at once, each against its own services
# (deploy/local/lanes.sh): lane B the wait-bound chaos packages (which restart their broker and
# database) and the mutants, lane C the sample of overlapping faults of every kind and the
# database failover, network-fault and shard-outage runs (with three shard clusters), lane D
# the consumer package (wait-bound on its real broker), the KIP-848 run, the fuzzers and the
# bench's smoke run, lane A the lint, every other package and the outside-module check.
test:
	deploy/local/with-services.sh deploy/local/lanes.sh test-lane-a test-lane-b test-lane-c test-lane-d

test-lane-a: lint gotest-main outside
test-lane-b: gotest-chaos mutants-safety
test-lane-c: gotest-faults
test-lane-d: gotest-consumer test-kip848 fuzz bench-smoke

# ci is an alias of test.
ci: test

# check assumes the services are up and their variables exported (see 'make env').
check: lint gotest mutants-safety fuzz

lint:
	@echo "== gofmt"; out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@echo "== go vet"; $(GO) vet ./...
	@echo "== staticcheck"; $(GO) tool staticcheck ./...
	@echo "== exported identifiers (internal/testkit/exports/budget.txt)"; $(GO) run ./internal/testkit/exports
	@echo "== history words (internal/testkit/historycheck.sh)"; internal/testkit/historycheck.sh
	@echo "== deploy/local install logic (dry run)"; deploy/local/install-test.sh

# gotest is every test: gotest-chaos runs the wait-bound packages, gotest-main the rest.
CHAOS_PKGS := ./internal/operator/chaos ./examples/saga
gotest: gotest-main gotest-consumer gotest-chaos gotest-faults

# SAMPLE_TEST is the sample of overlapping faults of every kind (as root, on a three-broker
# cluster and a primary with a standby it starts); COVERED_TESTS are the single-kind runs whose
# kinds it runs and proves, left out of make test (go test -run runs them). FAULT_TESTS are the
# sample and the chaos package's other runs that fail the database over, cut network links (a
# minority coordinator among them) or stop a shard's database: gotest-faults runs them (lane C),
# gotest-chaos the rest of the chaos packages (lane B), and then netleftovers.sh checks that no
# namespace, link, iptables chain or cgroup of a run that ended is left. gotest-sample runs the
# sample alone, on services of its own (e.g. a lane's).
SAMPLE_TEST := ^TestChaosOverlapEvery$$
COVERED_TESTS := ^(TestChaosNetFenced|TestChaosDBFailover|TestChaosCoordFaults|TestChaosTopicFaults|TestChaosMinorityFenced)$$
FAULT_TESTS := ^(TestChaosOverlapEvery|TestAsyncFailoverLoss|TestSyncFailoverWindow|TestChaosNetBaselines|TestChaosNetMutant|TestNetLayer.*|TestChaosShardOutage|TestChaosMinorityBaselines|TestChaosMinorityMutant)$$
gotest-chaos:
	@echo "== go test $(CHAOS_PKGS) but the overlapping, failover and network runs and the runs the sample covers ($${BATON_KAFKA_BROKERS:-no Kafka}, $${BATON_POSTGRES_URL:+a PostgreSQL})"
	$(GO) test $(GOTESTFLAGS) -skip '$(FAULT_TESTS)|$(COVERED_TESTS)' $(CHAOS_PKGS)

# The sample takes 10 to 15 minutes of the package's run on a loaded machine: a longer timeout.
gotest-faults:
	@echo "== go test ./internal/operator/chaos: the sample of overlapping faults, the failover and network runs ($${BATON_KAFKA_BROKERS:-no Kafka}, $${BATON_POSTGRES_URL:+a PostgreSQL})"
	BATON_CHAOS_OVERLAPPING=1 $(GO) test $(GOTESTFLAGS) -timeout 50m -run '$(FAULT_TESTS)' ./internal/operator/chaos
	@echo "== network namespaces, links, qdiscs, iptables chains and cgroups the network faults created: none may be left"
	internal/testkit/netleftovers.sh

gotest-sample:
	@echo "== go test ./internal/operator/chaos: overlapping faults of every kind ($${BATON_KAFKA_BROKERS:-no Kafka}, $${BATON_POSTGRES_URL:+a PostgreSQL})"
	BATON_CHAOS_OVERLAPPING=1 $(GO) test $(GOTESTFLAGS) -run '$(SAMPLE_TEST)' -v ./internal/operator/chaos
	@echo "== network namespaces, links, qdiscs, iptables chains and cgroups the sample created: none may be left"
	internal/testkit/netleftovers.sh

gotest-consumer:
	@echo "== go test ./consumer ($${BATON_KAFKA_BROKERS:-no Kafka}, $${BATON_POSTGRES_URL:+a PostgreSQL})"
	$(GO) test $(GOTESTFLAGS) ./consumer

gotest-main:
	@echo "== go test ./... but ./consumer and $(CHAOS_PKGS) ($${BATON_KAFKA_BROKERS:-no Kafka}, $${BATON_POSTGRES_URL:+a PostgreSQL})"
	$(GO) test $(GOTESTFLAGS) $$($(GO) list ./... | grep -v -x -F -e github.com/batonhq/baton/consumer $(foreach p,$(CHAOS_PKGS),-e github.com/batonhq/baton/$(patsubst ./%,%,$(p))))
	@echo "== go test fence/lease/k8slease (its own module: client-go stays out of Baton's graph)"
	cd fence/lease/k8slease && $(GO) vet ./... && $(GO) test $(GOTESTFLAGS) ./...
	@echo "== go test internal/deploytest (its own module: the Kubernetes and compose libraries stay out of Baton's graph)"
	cd internal/deploytest && $(GO) vet ./... && $(GO) test $(GOTESTFLAGS) ./...

# mutants runs every mutant (internal/testkit/mutants): a patch that reintroduces one bug into a
# scratch copy of the module, whose guard tests, having passed on the unpatched code, must then
# fail in seconds by the cause they assert (not by a build error, nor by a timed-out wait unless
# the bug is a stall). mutants-safety runs the safety-critical ones only (claim, proof, fence, outbox,
# inbox), as part of 'check'. Both print a line per mutant and exit non-zero if one survived or
# no longer applies or builds. MUTANTSFLAGS adds flags (e.g. -run Relay, -j 1, -v). Some guards
# need the services, as for 'check'.
MUTANTSFLAGS ?=
mutants:
	@echo "== mutants (all)"
	$(GO) run ./internal/testkit/cmd/mutants $(MUTANTSFLAGS)

mutants-safety:
	@echo "== mutants (safety-critical)"
	$(GO) run ./internal/testkit/cmd/mutants -group safety $(MUTANTSFLAGS)

# test-kip848 runs the consumer's real-service tests and a bounded chaos run in Kafka's consumer
# group protocol (KIP-848), against the exported broker: Kafka 4.3.1 by default, whose KIP-1251
# assignment epochs the consumer's KIP-848 token needs. 'gotest' ran the same tests, and the
# whole suite, in the classic protocol on that broker: both protocols, one broker, one version.
# The services must be up and exported, as for 'check'. The chaos run restarts the exported broker
# and PostgreSQL, as 'gotest''s does.
KIP848_RUN ?= ^(TestReal.*|TestAssignmentEpochs.*|TestChaosFenced)$$
KIP848_FAULTS ?= 8
KIP848_RECORDS_PER_KEY ?= 20
test-kip848:
	@set -euo pipefail; t0=$$SECONDS; \
	echo "== go test ./consumer ./internal/operator/chaos (Kafka $$(deploy/local/kafka.sh version | cut -d' ' -f1) on $$BATON_KAFKA_BROKERS, group protocol consumer)"; \
	BATON_GROUP_PROTOCOL=consumer BATON_CHAOS_FAULTS=$(KIP848_FAULTS) BATON_CONSUMER_RECORDS_PER_KEY=$(KIP848_RECORDS_PER_KEY) \
		$(GO) test $(GOTESTFLAGS) -run '$(KIP848_RUN)' ./consumer ./internal/operator/chaos; \
	echo "== test-kip848 took $$((SECONDS - t0))s"

# fuzz runs every fuzzer for FUZZTIME (bounded; the seed corpora also run in every go test): a
# count of executions, not a duration. A duration races Go 1.26's fuzzing coordinator on a
# loaded machine (its own deadline reported as the target's failure, "context deadline
# exceeded", go.dev/issue/75804; fixed in Go 1.27); a count has no deadline to race.
FUZZTIME ?= 10000x
FUZZERS := ./fence:FuzzParseToken ./outbox:FuzzParseEnvelope \
	./outbox:FuzzInboxAdmit ./outbox/internal/outboxstore:FuzzUnmarshalHeaders ./consumer:FuzzDeadLetterHeaders
# outside proves the examples and the public chaos API work from outside this module: each
# example builds in a scratch module of its own, and a program with its own workload on
# consumer/chaos gets PASS fenced and FAIL unfenced on the exported services (embedded kfake
# and SQLite without them), injecting only faults on its own workers (about 1 minute).
outside:
	internal/testkit/outside.sh

fuzz:
	@echo "== fuzz ($(FUZZTIME) each)"
	@for f in $(FUZZERS); do \
		$(GO) test -run '^$$' -fuzz "^$${f#*:}$$" -fuzztime $(FUZZTIME) "$${f%%:*}" || exit 1; \
	done

# bench runs 'baton bench' at full size (BENCHFLAGS adds flags, e.g. -rounds 3) and writes
# docs/bench/RESULTS.md and docs/bench/chart.svg. It takes minutes and both cores: run it on a quiet machine.
BENCHFLAGS ?=
bench:
	deploy/local/with-services.sh $(GO) run ./cmd/baton bench -out docs/bench $(BENCHFLAGS)

# bench-smoke checks every design's correctness (its fold), not its speed: tiny sizes, seconds;
# and the latency and scale modes' code paths, on a few hundred records.
# It also vets and staticchecks the peers' module (cmd/baton/internal/bench/peers), which ./... does not reach.
bench-smoke:
	@echo "== go vet, staticcheck (cmd/baton/internal/bench/peers)"; cd cmd/baton/internal/bench/peers && $(GO) vet ./... && $(GO) tool -modfile=../../../../../go.mod staticcheck ./...
	@echo "== baton bench (smoke)"
	$(GO) run ./cmd/baton bench -records 1200 -keys 60 -partitions 3 -slow-records 240 -conns 1,2 -timeout 2m
	@echo "== baton bench latency (smoke: every record timed, every fold checked)"
	$(GO) run ./cmd/baton bench latency -rates 500 -keys 60 -partitions 3 -warmup 200ms -duration 1s -fetch-max-wait '' -designs baton-fast,baton,kafka-read -timeout 1m
	@echo "== baton bench scale (smoke: a default point and one more, every fold checked)"
	$(GO) run ./cmd/baton bench scale -records 600 -keys 60 -partitions 3 -axis-partitions 3,6 -axis-keys 60 -axis-sizes 100 -conns 1 -timeout 1m

# gobench runs the Go benchmarks (go test -bench) against the real services.
gobench:
	deploy/local/with-services.sh $(GO) test -run '^$$' -bench . -benchtime 2s ./...

# deps installs what 'make test' needs (apt-get, once) without starting anything: for building
# a CI image. BATON_DRY_RUN=1 make deps only says what it would install.
deps:
	deploy/local/postgres.sh install
	deploy/local/redis.sh install
	deploy/local/chromium.sh install
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
	@echo "make test-kip848  the consumer's real-service tests and a chaos run in both group protocols"
	@echo "             against a Kafka 4.3 broker of its own (part of 'make test')"
	@echo "make outside  the examples and a program on the public chaos API, built outside this module"
	@echo "             (part of 'make test')"
	@echo "make mutants  every mutant patch applied to a scratch copy must fail its guard tests"
	@echo "             ('make mutants-safety': the safety-critical ones, part of 'make test')"
	@echo "make down    stop them ('make reset' also deletes their data)"
	@echo "BATON_DRY_RUN=1 make deps|test: say what would be installed, install and run nothing"
