#!/bin/sh
# `start`: a distributed Connect worker configured from the environment.
set -eu
[ "${1:-start}" = start ] || exec "$@"
: "${BOOTSTRAP_SERVERS:?the Connect stand-in needs BOOTSTRAP_SERVERS}"
: "${GROUP_ID:?}" "${CONFIG_STORAGE_TOPIC:?}" "${OFFSET_STORAGE_TOPIC:?}" "${STATUS_STORAGE_TOPIC:?}"
props=/kafka/config/connect-distributed.properties
cat > "$props" <<PROPS
bootstrap.servers=$BOOTSTRAP_SERVERS
group.id=$GROUP_ID
config.storage.topic=$CONFIG_STORAGE_TOPIC
offset.storage.topic=$OFFSET_STORAGE_TOPIC
status.storage.topic=$STATUS_STORAGE_TOPIC
config.storage.replication.factor=${CONFIG_STORAGE_REPLICATION_FACTOR:-1}
offset.storage.replication.factor=${OFFSET_STORAGE_REPLICATION_FACTOR:-1}
status.storage.replication.factor=${STATUS_STORAGE_REPLICATION_FACTOR:-1}
key.converter=${KEY_CONVERTER:-org.apache.kafka.connect.json.JsonConverter}
value.converter=${VALUE_CONVERTER:-org.apache.kafka.connect.json.JsonConverter}
offset.flush.interval.ms=${OFFSET_FLUSH_INTERVAL_MS:-60000}
listeners=http://0.0.0.0:8083
rest.advertised.host.name=${ADVERTISED_HOST_NAME:-$(hostname -i 2>/dev/null | cut -d' ' -f1)}
rest.advertised.port=8083
plugin.path=/kafka/connect
PROPS
env | sed -n 's/^\(CONNECT_[A-Za-z0-9_]*\)=.*/\1/p' | sort | while read -r var; do
    key=$(printf '%s' "${var#CONNECT_}" | tr 'A-Z' 'a-z' | tr '_' '.')
    printf '%s=%s\n' "$key" "$(printenv "$var")" >> "$props"
done
exec java ${HEAP_OPTS:--Xms256m -Xmx2g} -Dlog4j2.configurationFile=/kafka/config/log4j2.properties \
    -cp '/kafka/libs/*' org.apache.kafka.connect.cli.ConnectDistributed "$props"
