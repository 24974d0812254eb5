#!/bin/bash
# Entrypoint of the kafka-eventing-spark image (ENTRYPOINT ["/opt/entrypoint.sh"], at the path and with the
# driver/executor contract of the official Spark images' entrypoint, which Spark on Kubernetes and the Spark
# Operator rely on):
#
#   driver <spark-submit args>   the driver pod of `spark-submit --deploy-mode cluster --master k8s://...` (what the
#                                Spark Operator's SparkApplication runs): spark-submit in client mode, bound to the
#                                pod IP (SPARK_DRIVER_BIND_ADDRESS), the properties file Spark mounts, and the main
#                                file, e.g. local:///opt/venv/lib/python3.11/site-packages/kafka_eventing/reprocess/__main__.py
#   executor                     an executor pod: KubernetesExecutorBackend, configured by the SPARK_* variables
#                                the driver sets on the pod (SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, ...)
#   archive|replay|redrive|stats|-h|--help ...
#                                a reprocessing job in this container (`python -m kafka_eventing.reprocess`, Spark
#                                local mode unless --master says otherwise): the chart's CronJob/Job pass the job's
#                                command line as args. No args: --help (the image's CMD).
#   anything else                run as given (spark-submit, pyspark, python, bash ...)
#
# Everything runs under tini -s, which forwards signals and reaps the JVM's and Python workers' children.
# Unlike the official script there is no root → spark switch (the image's USER is 185 already) and no nss_wrapper:
# an arbitrary UID runs, only `whoami`-style lookups of it fail.
set -euo pipefail

: "${SPARK_HOME:?SPARK_HOME is not set}"
: "${JAVA_HOME:?JAVA_HOME is not set}"

# The jobs of kafka_eventing.reprocess.cli (tests/e2e/test_spark_image.py checks this list against the CLI).
JOBS=" archive replay redrive stats "

run() { exec /usr/bin/tini -s -- "$@"; }

case "${1:---help}" in
  driver)
    shift
    : "${SPARK_DRIVER_BIND_ADDRESS:?SPARK_DRIVER_BIND_ADDRESS is not set (set by Spark to the pod IP)}"
    run "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=$SPARK_DRIVER_BIND_ADDRESS" \
      --deploy-mode client \
      "$@"
    ;;
  executor)
    shift
    # Spark passes the executor's JVM options (spark.executor.extraJavaOptions, the driver's port ...) as
    # SPARK_JAVA_OPT_0..N; keep their numeric order.
    java_opts=()
    for name in $(compgen -e SPARK_JAVA_OPT_ | sort -t_ -k4 -n); do java_opts+=("${!name}"); done
    classpath="${SPARK_CONF_DIR:-$SPARK_HOME/conf}:${SPARK_HOME}/jars/*"
    [[ -z "${SPARK_EXTRA_CLASSPATH:-}" ]] || classpath="$classpath:$SPARK_EXTRA_CLASSPATH"
    [[ -z "${HADOOP_CONF_DIR:-}" ]] || classpath="$HADOOP_CONF_DIR:$classpath"
    [[ -z "${SPARK_DIST_CLASSPATH:-}" ]] || classpath="$classpath:$SPARK_DIST_CLASSPATH"
    classpath="$classpath:$PWD"  # SPARK-43540: files shipped with --files land in the working directory
    run "$JAVA_HOME/bin/java" "${java_opts[@]}" \
      -Xms"${SPARK_EXECUTOR_MEMORY:?}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "$classpath" \
      -Djdk.tls.trustNameService=true \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL:?}" \
      --executor-id "${SPARK_EXECUTOR_ID:?}" \
      --cores "${SPARK_EXECUTOR_CORES:?}" \
      --app-id "${SPARK_APPLICATION_ID:?}" \
      --hostname "${SPARK_EXECUTOR_POD_IP:?}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME:?}"
    ;;
  -*)
    run python -m kafka_eventing.reprocess "${@:---help}"
    ;;
  *)
    if [[ "$JOBS" == *" $1 "* ]]; then
      run python -m kafka_eventing.reprocess "$@"
    fi
    run "$@"
    ;;
esac
