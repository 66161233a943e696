package dev.flotilla.connect;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.config.AbstractConfig;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.components.Versioned;
import org.apache.kafka.connect.connector.ConnectRecord;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.header.ConnectHeaders;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.transforms.Transformation;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Sets aside a record Kafka would refuse for its size: in its place goes a small notice to the
 * record's dead-letter topic ({@code <topic>.dlq}), and the rows after it flow.
 *
 * <p>Why: Connect's producer refuses a record over {@code max.request.size} (1 MiB by default),
 * and a refused record fails the source task. Its source offset is never committed, so every
 * restart reads the same row and fails again: one oversized outbox row stopped its member's
 * publishing for good. Connect's {@code errors.tolerance=all} does not help under exactly-once
 * delivery (the failed send aborts the whole transaction) and, where it does, drops the record
 * with a log line only. Here the record never reaches the producer.
 *
 * <p>The notice keeps the record's key and its headers (each under {@value #KEPT_HEADER_BYTES}
 * bytes: the CloudEvents identity, so the dead-letter tools name the row, its incident and its
 * producer), has no value, and adds the fleet's dead-letter context headers
 * ({@code dlq_reason=unpublishable}, the size, the limit and the row's source position). The
 * row itself stays in the outbox table it came from: the notice is how an operator finds it.
 * It keeps the record's source offset, so Connect commits past the row as for any other.
 *
 * <p>The size is an upper bound of what the producer computes for one record in a batch of its
 * own (uncompressed: Connect's producer does not compress unless told to): key, value and
 * header bytes as Connect's string, byte-array and simple header converters write them, plus
 * {@value #RECORD_OVERHEAD} bytes for the batch and record framing and {@value #HEADER_OVERHEAD}
 * per header. libs/flotilla/connectors.py counts the outbox rows over the limit with the same
 * formula; keep the two equal.
 *
 * <p>Configuration: {@value #MAX_BYTES_CONFIG}, the most a record may take (the producer's
 * {@code max.request.size}, and no more than the topic's {@code max.message.bytes});
 * {@value #SUFFIX_CONFIG}, appended to the topic to name the dead-letter topic; and
 * {@value #ORIGIN_CONFIG}, who set it aside (the connector's name), written as
 * {@code dlq_consumer}. Chain it last, after any filter: the notice's topic is not the record's.
 */
public class SetAside<R extends ConnectRecord<R>> implements Transformation<R>, Versioned {

    public static final String MAX_BYTES_CONFIG = "max.bytes";
    public static final String SUFFIX_CONFIG = "topic.suffix";
    public static final String ORIGIN_CONFIG = "origin";

    /** Kafka's producer default max.request.size. */
    public static final long MAX_BYTES_DEFAULT = 1_048_576L;
    /** Batch header (61 bytes) and one record's framing and length varints, rounded up. */
    public static final int RECORD_OVERHEAD = 128;
    /** One header's two length varints, rounded up. */
    public static final int HEADER_OVERHEAD = 16;
    /** A header longer than this is left off the notice (named in its message instead). */
    static final int KEPT_HEADER_BYTES = 4096;
    /** A key longer than this is left off the notice (the notice is then unkeyed). */
    static final int KEPT_KEY_BYTES = 4096;
    /** As the fleet's dead letters cut dlq_error_message. */
    static final int MAX_MESSAGE = 2000;

    // The fleet's dead-letter context headers (libs/flotilla/deadletter.py).
    static final String ORIGIN_TOPIC = "dlq_origin_topic";
    static final String CONSUMER = "dlq_consumer";
    static final String REASON = "dlq_reason";
    static final String ERROR_CLASS = "dlq_error_class";
    static final String ERROR_MESSAGE = "dlq_error_message";
    static final String FIRST_FAILURE_TIME = "dlq_first_failure_time";
    static final String ATTEMPTS = "dlq_attempts";
    static final String RECORD_BYTES = "dlq_record_bytes";
    static final String SOURCE_POSITION = "dlq_source_position";
    static final String UNPUBLISHABLE = "unpublishable";
    /** What Kafka's producer would have failed the task with. */
    static final String TOO_LARGE = "RecordTooLargeException";

    public static final ConfigDef CONFIG_DEF = new ConfigDef()
            .define(MAX_BYTES_CONFIG, ConfigDef.Type.LONG, MAX_BYTES_DEFAULT, ConfigDef.Range.atLeast(1024),
                    ConfigDef.Importance.HIGH,
                    "The most bytes a record may take when produced (the producer's max.request.size, at most the topic's "
                            + "max.message.bytes). A larger record is replaced by a notice on its dead-letter topic.")
            .define(SUFFIX_CONFIG, ConfigDef.Type.STRING, ".dlq", new ConfigDef.NonEmptyString(),
                    ConfigDef.Importance.MEDIUM, "The dead-letter topic of a record is its topic followed by this.")
            .define(ORIGIN_CONFIG, ConfigDef.Type.STRING, "kafka-connect", new ConfigDef.NonEmptyString(),
                    ConfigDef.Importance.LOW, "Who set the record aside (the connector's name): the notice's dlq_consumer.");

    private static final Logger LOG = LoggerFactory.getLogger(SetAside.class);

    private long maxBytes = MAX_BYTES_DEFAULT;
    private String suffix = ".dlq";
    private String origin = "kafka-connect";

    @Override
    public void configure(Map<String, ?> configs) {
        AbstractConfig config = new AbstractConfig(CONFIG_DEF, configs);
        maxBytes = config.getLong(MAX_BYTES_CONFIG);
        suffix = config.getString(SUFFIX_CONFIG);
        origin = config.getString(ORIGIN_CONFIG);
    }

    @Override
    public R apply(R record) {
        if (record == null) {
            return null;
        }
        long size = estimatedBytes(record);
        if (size <= maxBytes) {
            return record;
        }
        return notice(record, size);
    }

    private R notice(R record, long size) {
        List<String> leftOff = new ArrayList<>();
        ConnectHeaders headers = new ConnectHeaders();
        for (Header header : record.headers()) {
            if (header.key().startsWith("dlq_")) {
                continue; // ours alone: a row cannot plant context
            }
            if (bytes(header.value()) > KEPT_HEADER_BYTES) {
                leftOff.add(header.key());
            } else {
                headers.add(header);
            }
        }
        Object key = bytes(record.key()) > KEPT_KEY_BYTES ? null : record.key();
        String eventId = firstString(record, "ce_id");
        String type = firstString(record, "ce_type");
        String position = record instanceof SourceRecord source && source.sourceOffset() != null
                ? String.valueOf(source.sourceOffset()) : "";
        String message = String.format(
                "record of about %d bytes (key %d, value %d) is over the %d bytes Kafka accepts; set aside by %s: the row "
                        + "(id %s, type %s) stays in its outbox table%s%s",
                size, bytes(record.key()), bytes(record.value()), maxBytes, origin, cut(eventId), cut(type),
                leftOff.isEmpty() ? "" : "; headers left off: " + String.join(",", leftOff),
                key == null && record.key() != null ? "; key left off" : "");
        headers.addString(ORIGIN_TOPIC, record.topic());
        headers.addString(CONSUMER, origin);
        headers.addString(REASON, UNPUBLISHABLE);
        headers.addString(ERROR_CLASS, TOO_LARGE);
        headers.addString(ERROR_MESSAGE, message.length() > MAX_MESSAGE ? message.substring(0, MAX_MESSAGE) : message);
        headers.addString(FIRST_FAILURE_TIME, Instant.now().truncatedTo(ChronoUnit.MILLIS).toString());
        headers.addString(ATTEMPTS, "1");
        headers.addString(RECORD_BYTES, Long.toString(size));
        if (!position.isEmpty()) {
            headers.addString(SOURCE_POSITION, position);
        }
        String topic = record.topic() + suffix;
        LOG.warn("Set aside a record for {} of about {} bytes (over {}): outbox row {} ({}) at source position {}; "
                + "a notice went to {}", record.topic(), size, maxBytes, cut(eventId), cut(type), position, topic);
        return record.newRecord(topic, null, key == null ? null : record.keySchema(), key,
                Schema.OPTIONAL_BYTES_SCHEMA, null, record.timestamp(), headers);
    }

    /** The record's produced size, bounded from above (see the class comment). */
    static long estimatedBytes(ConnectRecord<?> record) {
        long size = RECORD_OVERHEAD + bytes(record.key()) + bytes(record.value());
        for (Header header : record.headers()) {
            if (header.value() == null) {
                continue; // DropNullHeaders removes these before; a null header is sent as its key alone
            }
            size += HEADER_OVERHEAD + header.key().getBytes(StandardCharsets.UTF_8).length + bytes(header.value());
        }
        return size;
    }

    /** The bytes a key, value or header value takes as the outbox connector's converters write it. */
    static long bytes(Object value) {
        if (value == null) {
            return 0;
        }
        if (value instanceof byte[] raw) {
            return raw.length;
        }
        if (value instanceof ByteBuffer buffer) {
            return buffer.remaining();
        }
        // Strings as UTF-8; anything else as the simple header converter writes it (its text)
        return value.toString().getBytes(StandardCharsets.UTF_8).length;
    }

    /** The first header of that name, as the fleet's readers take it. */
    private static String firstString(ConnectRecord<?> record, String name) {
        for (Header header : record.headers()) {
            if (header.key().equals(name)) {
                return header.value() == null ? "?" : header.value().toString();
            }
        }
        return "?";
    }

    private static String cut(String text) {
        return text.length() > 200 ? text.substring(0, 200) + "…" : text;
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
}
