package dev.flotilla.connect;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.ServiceLoader;

import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.record.internal.AbstractRecords;
import org.apache.kafka.common.record.internal.CompressionType;
import org.apache.kafka.common.record.internal.RecordBatch;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.header.ConnectHeaders;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.transforms.Transformation;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

class SetAsideTest {

    private static final Map<String, ?> PARTITION = Map.of("server", "flotilla.flotilla_health");
    private static final Map<String, ?> OFFSET = Map.of("lsn", 4242L, "txId", 7L);
    private static final String EVENT_ID = "7f9c0e2a-0000-4000-8000-000000000001";

    private final SetAside<SourceRecord> transform = new SetAside<>();

    @AfterEach
    void close() {
        transform.close();
    }

    private void configure(long maxBytes) {
        transform.configure(Map.of(SetAside.MAX_BYTES_CONFIG, Long.toString(maxBytes), SetAside.ORIGIN_CONFIG,
                "outbox-flotilla-health"));
    }

    /** The headers an outbox row's record carries after DropNullHeaders. */
    private static ConnectHeaders outboxHeaders(String type) {
        ConnectHeaders headers = new ConnectHeaders();
        headers.addString("ce_specversion", "1.0");
        headers.addString("ce_id", EVENT_ID);
        headers.addString("ce_type", type);
        headers.addString("ce_source", "/flotilla/health-agent");
        headers.addString("ce_correlationid", "incident-1");
        headers.addString("ce_hops", "16");
        return headers;
    }

    private static SourceRecord record(int payloadBytes, String type) {
        return new SourceRecord(PARTITION, OFFSET, "incidents", null, Schema.STRING_SCHEMA, "incident-1",
                Schema.BYTES_SCHEMA, new byte[payloadBytes], 1_700_000_000_000L, outboxHeaders(type));
    }

    private static String header(SourceRecord record, String name) {
        Header header = record.headers().lastWithName(name);
        return header == null ? null : (String) header.value();
    }

    @Test
    void theSizeIsKeyValueAndHeadersWithTheirFraming() {
        // Equal to the figure libs/flotilla/connectors.py computes in SQL for the same row
        // (tests/integration/test_outbox_set_aside.py checks the two agree on a real row).
        ConnectHeaders headers = new ConnectHeaders();
        headers.addString("ce_id", EVENT_ID);
        headers.addString("ce_hops", "16");
        headers.add("ce_causationid", null, Schema.OPTIONAL_STRING_SCHEMA);
        SourceRecord record = new SourceRecord(PARTITION, OFFSET, "incidents", null, Schema.STRING_SCHEMA, "incident-1",
                Schema.BYTES_SCHEMA, new byte[1000], 0L, headers);
        long expected = SetAside.RECORD_OVERHEAD + 10 + 1000
                + (SetAside.HEADER_OVERHEAD + 5 + 36) + (SetAside.HEADER_OVERHEAD + 7 + 2);
        assertEquals(expected, SetAside.estimatedBytes(record));
        assertEquals(1220, expected);
    }

    /** What Kafka's producer compares with max.request.size, for the record as the converters write it. */
    private static int producersBound(SourceRecord record) {
        List<org.apache.kafka.common.header.Header> headers = new ArrayList<>();
        for (Header header : record.headers()) {
            byte[] value = header.value() == null ? null : header.value().toString().getBytes(StandardCharsets.UTF_8);
            headers.add(new RecordHeader(header.key(), value));
        }
        return AbstractRecords.estimateSizeInBytesUpperBound(RecordBatch.CURRENT_MAGIC_VALUE, CompressionType.NONE,
                ((String) record.key()).getBytes(StandardCharsets.UTF_8), (byte[]) record.value(),
                headers.toArray(new org.apache.kafka.common.header.Header[0]));
    }

    @Test
    void theSizeIsNeverBelowWhatTheProducerChecks() {
        // A record SetAside lets through is one the producer accepts; and the margin is small.
        for (int payload : new int[] {0, 1, 127, 128, 16_383, 16_384, 1_000_000, 1_048_576, 2_097_152}) {
            for (int extraHeaders : new int[] {0, 1, 11, 40}) {
                SourceRecord record = record(payload, "dev.flotilla.incidents.ServiceDegraded");
                for (int i = 0; i < extraHeaders; i++) {
                    record.headers().addString("h" + i, "v".repeat(i * 300));
                }
                long ours = SetAside.estimatedBytes(record);
                int kafkas = producersBound(record);
                assertTrue(ours >= kafkas, payload + " bytes, " + extraHeaders + " headers: " + ours + " < " + kafkas);
                assertTrue(ours - kafkas <= 128 + 16L * record.headers().size(), "within the framing allowance");
            }
        }
    }

    @Test
    void valuesCountAsTheConvertersWriteThem() {
        assertEquals(3, SetAside.bytes(new byte[3]));
        assertEquals(4, SetAside.bytes(ByteBuffer.wrap(new byte[9], 5, 4)));
        assertEquals(2, SetAside.bytes("é")); // UTF-8
        assertEquals(2, SetAside.bytes(16)); // the simple header converter writes a number as its text
        assertEquals(0, SetAside.bytes(null));
    }

    @Test
    void aRecordWithinTheLimitPassesUntouched() {
        configure(1_048_576);
        SourceRecord record = record(1_000_000, "dev.flotilla.incidents.ServiceDegraded");
        assertSame(record, transform.apply(record));
    }

    @Test
    void aRecordAtTheLimitPassesAndOneByteMoreIsSetAside() {
        SourceRecord record = record(2000, "dev.flotilla.incidents.ServiceDegraded");
        long size = SetAside.estimatedBytes(record);
        configure(size);
        assertSame(record, transform.apply(record));
        configure(size - 1);
        assertEquals("incidents.dlq", transform.apply(record).topic());
    }

    @Test
    void anOversizedRecordBecomesASmallNoticeOnItsDeadLetterTopic() {
        configure(1_048_576);
        SourceRecord record = record(1_100_000, "dev.flotilla.incidents.ServiceDegraded");
        SourceRecord notice = transform.apply(record);

        assertEquals("incidents.dlq", notice.topic());
        assertNull(notice.kafkaPartition()); // its key decides, as for the record
        assertEquals("incident-1", notice.key());
        assertNull(notice.value());
        assertTrue(SetAside.estimatedBytes(notice) < 4096, "the notice is small");
        // Connect commits past the row: the notice carries its source position
        assertEquals(PARTITION, notice.sourcePartition());
        assertEquals(OFFSET, notice.sourceOffset());
        // the row's identity, for the reconciler and the operator
        assertEquals(EVENT_ID, header(notice, "ce_id"));
        assertEquals("dev.flotilla.incidents.ServiceDegraded", header(notice, "ce_type"));
        assertEquals("incident-1", header(notice, "ce_correlationid"));
        // the fleet's dead-letter context
        assertEquals("incidents", header(notice, "dlq_origin_topic"));
        assertEquals("outbox-flotilla-health", header(notice, "dlq_consumer"));
        assertEquals("unpublishable", header(notice, "dlq_reason"));
        assertEquals("RecordTooLargeException", header(notice, "dlq_error_class"));
        assertEquals("1", header(notice, "dlq_attempts"));
        assertEquals(Long.toString(SetAside.estimatedBytes(record)), header(notice, "dlq_record_bytes"));
        assertTrue(header(notice, "dlq_source_position").contains("lsn=4242"));
        String message = header(notice, "dlq_error_message");
        assertTrue(message.contains(EVENT_ID) && message.contains("1048576"), message);
        assertTrue(header(notice, "dlq_first_failure_time").endsWith("Z"));
    }

    @Test
    void aHugeHeaderOrKeyIsLeftOffTheNoticeAndNamed() {
        configure(1_048_576);
        ConnectHeaders headers = outboxHeaders("x".repeat(1_100_000));
        SourceRecord record = new SourceRecord(PARTITION, OFFSET, "incidents", null, Schema.STRING_SCHEMA,
                "k".repeat(5000), Schema.BYTES_SCHEMA, new byte[10], 0L, headers);
        SourceRecord notice = transform.apply(record);
        assertEquals("incidents.dlq", notice.topic());
        assertNull(header(notice, "ce_type"));
        assertNull(notice.key());
        assertEquals(EVENT_ID, header(notice, "ce_id"));
        String message = header(notice, "dlq_error_message");
        assertTrue(message.contains("headers left off: ce_type") && message.contains("key left off"), message);
        assertTrue(message.length() <= SetAside.MAX_MESSAGE);
        assertTrue(SetAside.estimatedBytes(notice) < 8192, "the notice is small");
    }

    @Test
    void aRowCannotPlantItsOwnDeadLetterContext() {
        configure(1024);
        SourceRecord record = record(2000, "t");
        record.headers().addString("dlq_reason", "planted");
        SourceRecord notice = transform.apply(record);
        List<String> reasons = new ArrayList<>();
        notice.headers().allWithName("dlq_reason").forEachRemaining(h -> reasons.add((String) h.value()));
        assertEquals(List.of("unpublishable"), reasons);
    }

    @Test
    void theSuffixIsConfigurable() {
        transform.configure(Map.of(SetAside.MAX_BYTES_CONFIG, "1024", SetAside.SUFFIX_CONFIG, ".aside"));
        assertEquals("incidents.aside", transform.apply(record(2000, "t")).topic());
        assertEquals("kafka-connect", header(transform.apply(record(2000, "t")), "dlq_consumer"));
    }

    @Test
    void aNullRecordStaysNull() {
        configure(1024);
        assertNull(transform.apply(null));
    }

    @Test
    void aLimitBelowAKibibyteIsRefused() {
        assertThrows(ConfigException.class, () -> transform.configure(Map.of(SetAside.MAX_BYTES_CONFIG, "10")));
    }

    @Test
    @SuppressWarnings("rawtypes") // ServiceLoader takes the class literal, which has no type argument
    void connectFindsItAmongOurTransforms() {
        ServiceLoader<Transformation> loader = ServiceLoader.load(Transformation.class);
        List<String> classes = new ArrayList<>();
        loader.stream().forEach(provider -> classes.add(provider.type().getName()));
        assertTrue(classes.contains(SetAside.class.getName()), classes.toString());
        assertFalse(transform.version().isBlank());
        assertEquals("incident-1".getBytes(StandardCharsets.UTF_8).length, SetAside.bytes("incident-1"));
    }
}
