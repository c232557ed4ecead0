# Two commands: `make run` (set up, then run the whole system) and `make test`.
# Everything is installed from the pinned constraints.txt into .venv.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.9
# `make test` runs the suite on this many pytest-xdist workers, a test file per worker at a time
# (most of the suite waits on JVMs, Airflow's scheduler and servers, so two overlap well on two
# cores); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

JARS := $(VENV)/share/icefall/jars
# Apache Iceberg's own REST catalog server, for the tests of an external catalog (tests/jvm).
REST_FIXTURE_JARS := $(VENV)/share/icefall/test-jars/iceberg-rest-fixture
# Project Nessie's server (one runner jar; it needs Java 21+), for the tests of a Nessie catalog (tests/jvm).
NESSIE_JARS := $(VENV)/share/icefall/test-jars/nessie
# Apache Kafka's Java client, command-line tools and broker, for the tests that run them (tests/jvm).
KAFKA_JARS := $(VENV)/share/icefall/test-jars/kafka
# Spark Structured Streaming's Kafka source, for the test that reads a topic with it (tests/jvm).
SPARK_KAFKA_JARS := $(VENV)/share/icefall/test-jars/spark-kafka
# The Apache Iceberg Kafka Connect sink in a Kafka Connect worker, and spark-avro, for bench/vs_connect.py (bench/jvm).
BENCH_CONNECT_JARS := $(VENV)/share/icefall/bench-jars/connect
BENCH_SPARK_AVRO_JARS := $(VENV)/share/icefall/bench-jars/spark-avro
# The C extensions (built in place by the editable install).
EXT_SOURCES := broker/_gate.c broker/_utf8.h spark_jobs/_avro_columns.c spark_jobs/_kafka_records.c
# What the linters look at.
LINT_PATHS := broker spark_jobs dags plugins tests bench

.PHONY: setup system-deps run test test-deps test-unit docs bench bench-vs-kafka bench-vs-connect bench-sustained lint lint-code format-check format clean

setup: $(VENV)/.installed $(VENV)/.extensions $(JARS)/.pinned

# After each install the build's icefall.egg-info goes: seen from the repository (on sys.path) it
# would be a second `icefall` distribution, and Airflow would load the plugin twice.
$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "uv==$(UV_VERSION)"
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -c constraints.txt -e ".[test,docs]"
	rm -rf icefall.egg-info
	touch $@ $(VENV)/.extensions

# A changed C source rebuilds the extensions: the editable install of this package alone, again.
$(VENV)/.extensions: $(EXT_SOURCES) | $(VENV)/.installed
	$(BIN)/uv pip install -q --python $(BIN)/python -c constraints.txt --no-deps --reinstall-package icefall -e .
	rm -rf icefall.egg-info
	touch $@

# The Iceberg Spark runtime and AWS bundle from Maven Central by their coordinates
# (spark_jobs/jvm/pom.xml), checked against the committed checksums.
$(JARS)/.pinned: spark_jobs/jvm/pom.xml spark_jobs/jvm/jars.sha256 $(VENV)/.installed
	@command -v mvn >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq maven; }
	rm -rf $(JARS) && mkdir -p $(JARS)
	mvn -q -B -f spark_jobs/jvm/pom.xml dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(JARS)
	cd $(JARS) && sha256sum --strict -c $(CURDIR)/spark_jobs/jvm/jars.sha256
	touch $@

# Debian packages the tests use: kcat (a real librdkafka CLI client), chromium
# (the Airflow "Table topics" view behind its login, driven over the DevTools protocol), postgresql (the broker's
# metadata store on Postgres; tests start their own server in a temporary directory)
# and libfaketime (an S3 server whose clock is set back, for orphan files days old).
system-deps:
	@{ command -v kcat >/dev/null && command -v chromium >/dev/null \
	   && [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] \
	   && { command -v pg_ctl >/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; }; } || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq kcat chromium postgresql libfaketime; }

run: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/icefall up

# What the suite needs set up (after `make setup system-deps`, `make -j4 test-deps` fetches the
# test jars side by side).
test-deps: setup system-deps $(REST_FIXTURE_JARS)/.pinned $(NESSIE_JARS)/.pinned $(KAFKA_JARS)/.pinned \
      $(SPARK_KAFKA_JARS)/.pinned

test: test-deps
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

$(REST_FIXTURE_JARS)/.pinned: tests/jvm/iceberg-rest-fixture/pom.xml tests/jvm/iceberg-rest-fixture/jars.sha256 $(JARS)/.pinned
	rm -rf $(REST_FIXTURE_JARS) && mkdir -p $(REST_FIXTURE_JARS)
	mvn -q -B -f tests/jvm/iceberg-rest-fixture/pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(CURDIR)/$(REST_FIXTURE_JARS)
	cd $(REST_FIXTURE_JARS) && sha256sum --strict --quiet -c $(CURDIR)/tests/jvm/iceberg-rest-fixture/jars.sha256
	touch $@

$(NESSIE_JARS)/.pinned: tests/jvm/nessie/pom.xml tests/jvm/nessie/jars.sha256
	rm -rf $(NESSIE_JARS) && mkdir -p $(NESSIE_JARS)
	mvn -q -B -f tests/jvm/nessie/pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(CURDIR)/$(NESSIE_JARS)
	cd $(NESSIE_JARS) && sha256sum --strict --quiet -c $(CURDIR)/tests/jvm/nessie/jars.sha256
	touch $@

$(KAFKA_JARS)/.pinned: tests/jvm/kafka/pom.xml tests/jvm/kafka/jars.sha256 $(JARS)/.pinned
	rm -rf $(KAFKA_JARS) && mkdir -p $(KAFKA_JARS)
	mvn -q -B -f tests/jvm/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	  -DoutputDirectory=$(CURDIR)/$(KAFKA_JARS)
	cd $(KAFKA_JARS) && sha256sum --strict --quiet -c $(CURDIR)/tests/jvm/kafka/jars.sha256
	touch $@

$(SPARK_KAFKA_JARS)/.pinned: tests/jvm/spark-kafka/pom.xml tests/jvm/spark-kafka/jars.sha256 $(JARS)/.pinned
	rm -rf $(SPARK_KAFKA_JARS) && mkdir -p $(SPARK_KAFKA_JARS)
	mvn -q -B -f tests/jvm/spark-kafka/pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(CURDIR)/$(SPARK_KAFKA_JARS)
	cd $(SPARK_KAFKA_JARS) && sha256sum --strict --quiet -c $(CURDIR)/tests/jvm/spark-kafka/jars.sha256
	touch $@

# The quick loop: tests without a broker process, S3 server, Spark or Airflow (markers: tests/conftest.py).
test-unit: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -m unit $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml), built with warnings as errors
# (NO_MKDOCS_2_WARNING: without Material's end-of-life banner in every build log).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d build/site

bench: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/produce_consume.py

# The broker beside Apache Kafka 4.1 (its Maven Central jars), Kafka's perf tools as the client.
bench-vs-kafka: setup $(KAFKA_JARS)/.pinned
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/vs_kafka.py $(BENCH_ARGS)

$(BENCH_CONNECT_JARS)/.pinned: bench/jvm/connect/pom.xml bench/jvm/connect/jars.sha256 $(JARS)/.pinned
	rm -rf $(BENCH_CONNECT_JARS) && mkdir -p $(BENCH_CONNECT_JARS)
	mvn -q -B -f bench/jvm/connect/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	  -DoutputDirectory=$(CURDIR)/$(BENCH_CONNECT_JARS)
	cd $(BENCH_CONNECT_JARS) && sha256sum --strict --quiet -c $(CURDIR)/bench/jvm/connect/jars.sha256
	touch $@

$(BENCH_SPARK_AVRO_JARS)/.pinned: bench/jvm/spark-avro/pom.xml bench/jvm/spark-avro/jars.sha256 $(JARS)/.pinned
	rm -rf $(BENCH_SPARK_AVRO_JARS) && mkdir -p $(BENCH_SPARK_AVRO_JARS)
	mvn -q -B -f bench/jvm/spark-avro/pom.xml dependency:copy-dependencies \
	  -DoutputDirectory=$(CURDIR)/$(BENCH_SPARK_AVRO_JARS)
	cd $(BENCH_SPARK_AVRO_JARS) && sha256sum --strict --quiet -c $(CURDIR)/bench/jvm/spark-avro/jars.sha256
	touch $@

# Commit rounds beside the Iceberg Kafka Connect sink and Spark Structured Streaming (BENCH_ARGS=--quick: a short run).
bench-vs-connect: setup $(SPARK_KAFKA_JARS)/.pinned $(BENCH_CONNECT_JARS)/.pinned $(BENCH_SPARK_AVRO_JARS)/.pinned
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/vs_connect.py $(BENCH_ARGS)

# Sustained ingest under `icefall up`, warm round driver vs spark-submit per round (BENCH_ARGS=--quick: a short run).
bench-sustained: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/sustained.py $(BENCH_ARGS)

# ruff's rules, mypy (its files and settings: pyproject.toml), then the formatting.
lint: lint-code format-check

lint-code: setup
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy

format-check: setup
	$(BIN)/ruff format --check $(LINT_PATHS)

format: setup
	$(BIN)/ruff format $(LINT_PATHS)

clean:
	rm -rf $(VENV) .icefall
