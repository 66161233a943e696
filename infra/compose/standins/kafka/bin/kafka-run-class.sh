#!/bin/sh
# java with Kafka's jars on the classpath: `kafka-run-class.sh <main class> <args>`. The
# broker logs at INFO to stdout, the tools only their warnings to stderr.
case "$1" in
    kafka.Kafka) log4j=/opt/kafka/config/log4j2.properties ;;
    *) log4j=/opt/kafka/config/tools-log4j2.properties ;;
esac
exec java ${KAFKA_HEAP_OPTS:-} ${KAFKA_OPTS:-} -Dlog4j2.configurationFile="$log4j" -cp '/opt/kafka/libs/*' "$@"
