#!/usr/bin/env bash
# Container entrypoint. Spark on Kubernetes starts the driver pod with "driver …" and each
# executor pod with "executor" (its settings in SPARK_* variables); anything else runs as
# given (default: `delayq run`).
set -euo pipefail

# delayq's local file system first: fs.file.impl names it (streaming/spark/session.py).
jars_classpath() { echo "${DELAYQ_JARS_DIR}/localfs/*:${SPARK_HOME}/jars/*:${DELAYQ_JARS_DIR}/spark/*"; }

case "${1:-}" in
  driver)
    shift
    # The operator already decided where the driver runs: here, in client mode. Kubernetes
    # stops the pod with SIGTERM (tini hands it on): streaming.spark.supervise passes it to the
    # Python driver, whose clean stop lets the batch under way finish; spark-submit's JVM
    # would stop the query mid-batch.
    exec "${PYSPARK_DRIVER_PYTHON:-python3}" -m streaming.spark.supervise \
      "${SPARK_HOME}/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    java_opts=()
    while IFS='=' read -r name value; do
      [[ "$name" == SPARK_JAVA_OPT_* ]] && java_opts+=("$value")
    done < <(env)
    exec "${JAVA_HOME}/bin/java" "${java_opts[@]}" \
      -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "$(jars_classpath)" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" \
      --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" \
      --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
  *)
    exec "$@"
    ;;
esac
