# Targets a newcomer can guess. `make help` lists them.
GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
FUZZTIME  ?= 15s

.PHONY: help demo build test fuzz lint clean soak bench flakehunt

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

demo: ## the upstream simulator and the gateway (bin/demo.yaml, from config.example.yaml) with examples to try; no Redis needed
	scripts/demo.sh

build: ## build static binaries into bin/ (scripts/build.sh: the line CI and the Dockerfile use)
	GO=$(GO) VERSION=$(VERSION) scripts/build.sh bin

test: ## the whole suite with -race; installs redis-server, redis-tools, prometheus, chromium (apt-get, as root) and the AI SDK clients (npm ci) when missing
	scripts/test.sh

flakehunt: ## the timing-sensitive tests under -race, COUNT (default 3) times each, beside two busy loops (scripts/flakehunt.sh)
	scripts/flakehunt.sh

fuzz: ## run every fuzz target for FUZZTIME each (default 15s)
	FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

soak: ## SOAK_MINUTES (default 5) of mixed traffic on 2 replicas with Redis and the upstream flapping
	SOAK_MINUTES=$(or $(SOAK_MINUTES),5) $(GO) run ./soak

lint: ## gofmt and go vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...

bench: ## benchmark suite: direct, bare, gateway (memory, redis, cluster); ROUNDS, DURATION, ... (scripts/bench.sh)
	scripts/bench.sh

clean: ## remove build output
	rm -rf bin
