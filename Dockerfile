# syntax=docker/dockerfile:1
#
# The Icefall image: one image for every Icefall process in docker-compose.yml
# (the broker, Airflow's api-server/scheduler/dag-processor/triggerer, the Spark
# worker). One image on purpose: the Spark driver runs inside the Airflow task
# (spark-submit in client mode) and the executors run on the worker, and PySpark
# needs the same Python version, the same `broker`/`spark_jobs` code and the same
# PySpark on both sides; installing everything from constraints.txt into one
# image is how the tests run it too.
#
#   docker build -t icefall:dev .
#   docker run --rm -p 9092:9092 -p 8090:8090 -p 8081:8081 -p 8181:8181 icefall:dev
# The Iceberg Spark runtime and AWS bundle, by their Maven Central coordinates
# (spark_jobs/jvm/pom.xml) and checked against the committed checksums, as `make setup` does.
FROM maven:3.9-eclipse-temurin-17 AS jars
WORKDIR /build
COPY spark_jobs/jvm/pom.xml spark_jobs/jvm/jars.sha256 ./
RUN mvn -q -B -f pom.xml dependency:copy-dependencies -DoutputDirectory=/jars \
    && cd /jars && sha256sum --strict -c /build/jars.sha256

FROM python:3.11-slim-bookworm

# Java for Spark (the worker, and the driver that spark-submit starts in Airflow
# tasks); gcc builds the data quality gate's C validator (broker/_gate.c); curl
# and procps for healthchecks and Spark's launch scripts.
RUN apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless gcc libc6-dev curl procps \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/default-java \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# uid 50000, group 0 as in Airflow's image; the directories named volumes mount on
# exist here and belong to it, so Docker initialises the volumes writable for it
RUN useradd --create-home --uid 50000 --gid 0 icefall \
    && mkdir -p /opt/icefall /var/lib/icefall /opt/airflow/logs /home/icefall/.ivy2 \
    && chown -R icefall:0 /opt/icefall /var/lib/icefall /opt/airflow /home/icefall/.ivy2

WORKDIR /opt/icefall
# Dependencies first (cached while only the sources change), pinned by constraints.txt;
# psycopg2 is the Postgres driver of Airflow's metadata DB and of the Iceberg catalog.
COPY constraints.txt pyproject.toml README.md ./
COPY broker ./broker
COPY spark_jobs ./spark_jobs
# plugins/icefall_airflow is installed too: the Airflow plugin is its entry point
COPY --chown=icefall:0 plugins ./plugins
RUN pip install --no-cache-dir -c constraints.txt . "psycopg2-binary==2.9.10"
COPY --from=jars /jars /opt/icefall/jars
COPY --chown=icefall:0 dags ./dags

ENV ICEFALL_HOME=/var/lib/icefall \
    ICEFALL_JARS_DIR=/opt/icefall/jars \
    AIRFLOW_HOME=/opt/airflow
USER icefall
EXPOSE 9092 8090 8081 8181
CMD ["icefall", "broker", "--host", "0.0.0.0"]
