package dev.flotilla.connect;

import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Predicate;

import org.apache.kafka.common.config.AbstractConfig;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.connect.components.Versioned;
import org.apache.kafka.connect.connector.ConnectRecord;
import org.apache.kafka.connect.header.ConnectHeaders;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.header.Headers;
import org.apache.kafka.connect.transforms.Transformation;

/**
 * Drops every header whose value is null, keeping the others in their order.
 *
 * <p>Why: Debezium's Outbox Event Router places each extra outbox column as a header and
 * adds one for a NULL column too, with a null value. CloudEvents says an absent attribute
 * is an absent header, and the CloudEvents SDKs fail on a header without a value. No stock
 * transform or predicate drops a header by its value, so this one does, chained after the
 * outbox transform.
 *
 * <p>Configuration: {@code headers}, an optional list of header names; when set, only those
 * names are dropped (and only when null). Empty, the default, means every header.
 */
public class DropNullHeaders<R extends ConnectRecord<R>> implements Transformation<R>, Versioned {

    public static final String HEADERS_CONFIG = "headers";

    public static final ConfigDef CONFIG_DEF = new ConfigDef()
            .define(
                    HEADERS_CONFIG,
                    ConfigDef.Type.LIST,
                    List.of(),
                    ConfigDef.LambdaValidator.with(DropNullHeaders::validateNames, () -> "a list of non-blank header names"),
                    ConfigDef.Importance.LOW,
                    "Header names to drop when their value is null. Empty (the default): every header whose value is null.");

    private Predicate<String> dropsName = name -> true;

    @Override
    public void configure(Map<String, ?> configs) {
        List<String> names = new AbstractConfig(CONFIG_DEF, configs).getList(HEADERS_CONFIG);
        if (names.isEmpty()) {
            dropsName = name -> true;
        } else {
            Set<String> only = Set.copyOf(names);
            dropsName = only::contains;
        }
    }

    @Override
    public R apply(R record) {
        if (record == null) {
            return null;
        }
        Headers headers = record.headers();
        if (!hasDroppable(headers)) {
            return record; // the usual case for most records: no copy
        }
        ConnectHeaders kept = new ConnectHeaders();
        for (Header header : headers) {
            if (!droppable(header)) {
                kept.add(header);
            }
        }
        return record.newRecord(
                record.topic(),
                record.kafkaPartition(),
                record.keySchema(),
                record.key(),
                record.valueSchema(),
                record.value(),
                record.timestamp(),
                kept);
    }

    private boolean hasDroppable(Headers headers) {
        for (Header header : headers) {
            if (droppable(header)) {
                return true;
            }
        }
        return false;
    }

    private boolean droppable(Header header) {
        return header.value() == null && dropsName.test(header.key());
    }

    @Override
    public ConfigDef config() {
        return CONFIG_DEF;
    }

    @Override
    public String version() {
        return PluginVersion.VALUE;
    }

    @Override
    public void close() {
        // nothing held
    }

    private static void validateNames(String name, Object value) {
        if (!(value instanceof List<?> names)) {
            throw new ConfigException(name, value, "must be a list of header names");
        }
        for (Object item : names) {
            if (!(item instanceof String header) || header.isBlank()) {
                throw new ConfigException(name, value, "header names must not be blank");
            }
        }
    }
}
