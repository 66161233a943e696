package dev.flotilla.connect;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.ServiceLoader;
import java.util.Set;

import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.header.ConnectHeaders;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.sink.SinkRecord;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.transforms.Transformation;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

class DropNullHeadersTest {

    private static final Map<String, ?> PARTITION = Map.of("server", "flotilla.flotilla");
    private static final Map<String, ?> OFFSET = Map.of("lsn", 42L);
    private static final byte[] PAYLOAD = {0, 0, 0, 0, 7, 2, 4};

    private final DropNullHeaders<SourceRecord> transform = new DropNullHeaders<>();

    @AfterEach
    void close() {
        transform.close();
    }

    /** The headers the Outbox Event Router gives a root record: ce_causationid with a null value. */
    private static ConnectHeaders outboxHeaders(String causationId) {
        ConnectHeaders headers = new ConnectHeaders();
        headers.addString("id", "7f9c0e2a-0000-4000-8000-000000000001");
        headers.addString("ce_id", "7f9c0e2a-0000-4000-8000-000000000001");
        headers.addString("ce_type", "dev.flotilla.incidents.ServiceLatencyIncreased");
        headers.addString("ce_correlationid", "incident-1");
        headers.add("ce_causationid", causationId, Schema.OPTIONAL_STRING_SCHEMA);
        headers.addString("ce_hops", "16");
        headers.add("ce_traceparent", null, Schema.OPTIONAL_STRING_SCHEMA);
        headers.addString("content-type", "application/avro");
        return headers;
    }

    private static SourceRecord record(ConnectHeaders headers) {
        return new SourceRecord(
                PARTITION, OFFSET, "incidents", 3, Schema.STRING_SCHEMA, "incident-1",
                Schema.BYTES_SCHEMA, PAYLOAD, 1_700_000_000_000L, headers);
    }

    private static List<String> names(SourceRecord record) {
        List<String> names = new ArrayList<>();
        for (Header header : record.headers()) {
            names.add(header.key());
        }
        return names;
    }

    @Test
    void dropsEveryNullHeaderAndKeepsTheRestInOrder() {
        transform.configure(Map.of());
        SourceRecord out = transform.apply(record(outboxHeaders(null)));

        assertEquals(List.of("id", "ce_id", "ce_type", "ce_correlationid", "ce_hops", "content-type"), names(out));
        for (Header header : out.headers()) {
            assertTrue(header.value() != null, header.key());
        }
        assertNull(out.headers().lastWithName("ce_causationid"));
    }

    @Test
    void keepsANonNullHeaderWithItsValueAndSchema() {
        transform.configure(Map.of());
        SourceRecord out = transform.apply(record(outboxHeaders("5b1d6c3e-0000-4000-8000-000000000002")));

        Header causation = out.headers().lastWithName("ce_causationid");
        assertEquals("5b1d6c3e-0000-4000-8000-000000000002", causation.value());
        assertEquals(Schema.OPTIONAL_STRING_SCHEMA, causation.schema());
        assertEquals(
                List.of("id", "ce_id", "ce_type", "ce_correlationid", "ce_causationid", "ce_hops", "content-type"),
                names(out));
    }

    @Test
    void keepsEverythingButTheHeadersAndTheSourcePosition() {
        transform.configure(Map.of());
        SourceRecord in = record(outboxHeaders(null));
        SourceRecord out = transform.apply(in);

        assertEquals(in.topic(), out.topic());
        assertEquals(in.kafkaPartition(), out.kafkaPartition());
        assertEquals(in.keySchema(), out.keySchema());
        assertEquals(in.key(), out.key());
        assertEquals(in.valueSchema(), out.valueSchema());
        assertSame(in.value(), out.value());
        assertEquals(in.timestamp(), out.timestamp());
        assertEquals(in.sourcePartition(), out.sourcePartition());
        assertEquals(in.sourceOffset(), out.sourceOffset());
        assertEquals(8, in.headers().size(), "the input record is not changed");
    }

    @Test
    void aRecordWithoutNullHeadersIsReturnedAsItIs() {
        transform.configure(Map.of());
        ConnectHeaders headers = new ConnectHeaders();
        headers.addString("ce_id", "x");
        SourceRecord in = record(headers);

        assertSame(in, transform.apply(in));
    }

    @Test
    void aRecordWithNoHeadersPasses() {
        transform.configure(Map.of());
        SourceRecord in = record(null);

        SourceRecord out = transform.apply(in);
        assertSame(in, out);
        assertTrue(out.headers().isEmpty());
    }

    @Test
    void aTombstoneKeepsItsNullValueAndLosesOnlyItsNullHeaders() {
        transform.configure(Map.of());
        ConnectHeaders headers = new ConnectHeaders();
        headers.add("ce_causationid", null, Schema.OPTIONAL_STRING_SCHEMA);
        headers.addString("ce_id", "x");
        SourceRecord tombstone = new SourceRecord(
                PARTITION, OFFSET, "incidents", null, Schema.STRING_SCHEMA, "incident-1", null, null, null, headers);

        SourceRecord out = transform.apply(tombstone);
        assertNull(out.value());
        assertNull(out.valueSchema());
        assertEquals(List.of("ce_id"), names(out));
    }

    @Test
    void aNullRecordStaysNull() {
        transform.configure(Map.of());
        assertNull(transform.apply(null));
    }

    @Test
    void sinkRecordsAreTransformedToo() {
        DropNullHeaders<SinkRecord> sink = new DropNullHeaders<>();
        sink.configure(Map.of());
        SinkRecord in = new SinkRecord(
                "incidents", 0, Schema.STRING_SCHEMA, "k", Schema.BYTES_SCHEMA, PAYLOAD, 9L, null, null,
                outboxHeaders(null));

        SinkRecord out = sink.apply(in);
        assertNull(out.headers().lastWithName("ce_causationid"));
        assertEquals(9L, out.kafkaOffset());
        sink.close();
    }

    @Test
    void aListOfNamesDropsOnlyThoseNames() {
        transform.configure(Map.of(DropNullHeaders.HEADERS_CONFIG, "ce_causationid"));
        SourceRecord out = transform.apply(record(outboxHeaders(null)));

        assertNull(out.headers().lastWithName("ce_causationid"));
        Header traceparent = out.headers().lastWithName("ce_traceparent");
        assertTrue(traceparent != null && traceparent.value() == null, "an unnamed null header is kept");
    }

    @Test
    void aNamedHeaderWithAValueIsKept() {
        transform.configure(Map.of(DropNullHeaders.HEADERS_CONFIG, "ce_causationid, ce_traceparent"));
        SourceRecord out = transform.apply(record(outboxHeaders("cause")));

        assertEquals("cause", out.headers().lastWithName("ce_causationid").value());
        assertNull(out.headers().lastWithName("ce_traceparent"));
    }

    @Test
    void anEmptyListMeansEveryHeader() {
        transform.configure(Map.of(DropNullHeaders.HEADERS_CONFIG, ""));
        SourceRecord out = transform.apply(record(outboxHeaders(null)));

        assertFalse(names(out).contains("ce_causationid"));
        assertFalse(names(out).contains("ce_traceparent"));
    }

    @Test
    void aBlankHeaderNameIsRefused() {
        ConfigException refused = assertThrows(
                ConfigException.class,
                () -> transform.configure(Map.of(DropNullHeaders.HEADERS_CONFIG, "ce_causationid,,ce_traceparent")));
        assertTrue(refused.getMessage().contains("must not be blank"), refused.getMessage());
    }

    @Test
    void aValueThatIsNotAListIsRefused() {
        assertThrows(ConfigException.class, () -> transform.configure(Map.of(DropNullHeaders.HEADERS_CONFIG, 42)));
    }

    @Test
    void theConfigDefDocumentsItsOneOption() {
        assertEquals(Set.of(DropNullHeaders.HEADERS_CONFIG), transform.config().names());
        assertEquals(List.of(), transform.config().defaultValues().get(DropNullHeaders.HEADERS_CONFIG));
    }

    @Test
    void reportsTheProjectVersion() {
        assertEquals(System.getProperty("project.version"), transform.version());
    }

    @Test
    @SuppressWarnings("rawtypes") // ServiceLoader takes the class literal, which has no type argument
    void isFoundByServiceLoaderAsConnectDoes() {
        // Connect's plugin.discovery=service_load finds transforms through this manifest only.
        ServiceLoader<Transformation> loader = ServiceLoader.load(Transformation.class);
        List<String> classes = new ArrayList<>();
        loader.stream().forEach(provider -> classes.add(provider.type().getName()));
        assertTrue(classes.contains(DropNullHeaders.class.getName()), classes.toString());
    }
}
