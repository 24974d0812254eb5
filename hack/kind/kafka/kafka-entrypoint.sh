#!/bin/sh
# Formats the broker's storage on first start (with the SCRAM user of KAFKA_SCRAM_USER/KAFKA_SCRAM_PASSWORD when
# set), then runs the broker, as kafka-server-start.sh would: KAFKA_CONFIG names its server.properties.
set -euf
CONFIG=${KAFKA_CONFIG:-/etc/kafka/server.properties}
HEAP=${KAFKA_HEAP:-512m}
java_cp() {
  exec_=$1
  shift
  $exec_ java "-Xmx$HEAP" "-Xms$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j.configuration=file:/opt/kafka/log4j.properties -cp '/opt/kafka/libs/*' "$@"
}
if [ -n "${KAFKA_SCRAM_USER:-}" ]; then
  scram="name=$KAFKA_SCRAM_USER,password=$KAFKA_SCRAM_PASSWORD"
  set -- --add-scram "SCRAM-SHA-512=[$scram]" --add-scram "SCRAM-SHA-256=[$scram]"
else
  set --
fi
id=$(java_cp "" kafka.tools.StorageTool random-uuid | tail -n 1)
java_cp "" kafka.tools.StorageTool format -t "$id" -c "$CONFIG" --ignore-formatted "$@"
java_cp exec kafka.Kafka "$CONFIG"
