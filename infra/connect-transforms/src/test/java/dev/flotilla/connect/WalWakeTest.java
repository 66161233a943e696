package dev.flotilla.connect;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import javax.net.SocketFactory;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.postgresql.core.PGStream;
import org.postgresql.util.HostSpec;

/**
 * The wait against pgjdbc's own stream over a real socket (the other end stands in for the
 * walsender), and the members {@link WalWake#install} needs, on the Debezium this plugin runs on.
 */
class WalWakeTest {

    private ServerSocket server;
    private Socket walsender;
    private PGStream stream;
    private final ScheduledExecutorService later = Executors.newSingleThreadScheduledExecutor();

    @BeforeEach
    void connect() throws Exception {
        server = new ServerSocket(0, 1, InetAddress.getLoopbackAddress());
        stream = new PGStream(SocketFactory.getDefault(), new HostSpec("127.0.0.1", server.getLocalPort()), 5_000, 8192);
        walsender = server.accept();
    }

    @AfterEach
    void close() throws Exception {
        later.shutdownNow();
        stream.close();
        walsender.close();
        server.close();
    }

    @Test
    void aChangeEndsTheWaitAndIsLeftForTheReader() throws Exception {
        later.schedule(() -> send(xlogData()), 200, TimeUnit.MILLISECONDS);
        long started = System.nanoTime();

        assertTrue(new WalWake(() -> stream, 30_000).sleepWhen(true));

        assertTrue(millisSince(started) < 20_000, "woken by the change, not by the longest wait");
        assertEquals('d', stream.receiveChar()); // nothing consumed
        assertEquals(0, stream.getNetworkTimeout()); // the reader's timeout is back
    }

    @Test
    void keepalivesDoNotEndTheWaitAndStayForTheReader() throws Exception {
        send(keepalive(), keepalive(), keepalive());
        long started = System.nanoTime();

        assertTrue(new WalWake(() -> stream, 300).sleepWhen(true));

        assertTrue(millisSince(started) >= 280, "woken by a keepalive after " + millisSince(started) + " ms");
        assertEquals('d', stream.receiveChar());
        assertEquals(3 * keepalive().length - 1, stream.receive(3 * keepalive().length - 1).length); // all three still there
    }

    @Test
    void aChangeAfterKeepalivesEndsTheWait() throws Exception {
        send(keepalive(), keepalive());
        later.schedule(() -> send(keepalive(), xlogData()), 200, TimeUnit.MILLISECONDS);
        long started = System.nanoTime();

        assertTrue(new WalWake(() -> stream, 30_000).sleepWhen(true));

        long waited = millisSince(started);
        assertTrue(waited >= 150 && waited < 20_000, "woken by the change after the keepalives: " + waited + " ms");
    }

    @Test
    void manyKeepalivesAreHandedToTheReaderBeforeTheLongestWait() throws Exception {
        byte[][] lots = new byte[WalWake.KEEPALIVE_BYTES / keepalive().length + 2][];
        java.util.Arrays.fill(lots, keepalive());
        send(lots);
        long started = System.nanoTime();

        assertTrue(new WalWake(() -> stream, 30_000).sleepWhen(true));

        assertTrue(millisSince(started) < 20_000, "so the buffer does not grow without bound");
    }

    @Test
    void anythingButCopyDataEndsTheWait() throws Exception {
        send(new byte[]{ 'E', 0, 0, 0, 5, 'S' }); // an error: the reader's to report
        long started = System.nanoTime();

        assertTrue(new WalWake(() -> stream, 30_000).sleepWhen(true));

        assertTrue(millisSince(started) < 20_000);
    }

    @Test
    void withoutAChangeItWaitsAtMostTheLongestWait() throws Exception {
        stream.setNetworkTimeout(7_000);

        assertTrue(new WalWake(() -> stream, 50).sleepWhen(true));

        assertEquals(7_000, stream.getNetworkTimeout());
        send(xlogData());
        assertEquals('d', stream.receiveChar()); // the stream still reads after a timed-out wait
    }

    @Test
    void noCriteriaNoWait() {
        assertFalse(new WalWake(() -> { throw new AssertionError("looked for the stream"); }, 60_000).sleepWhen(false));
    }

    @Test
    void noStreamOrABrokenOneSleepsInstead() throws Exception {
        long started = System.nanoTime();
        assertTrue(new WalWake(() -> null, 50).sleepWhen(true));
        assertTrue(millisSince(started) >= 45);

        walsender.close(); // end of stream: the wait fails at once and falls back to a sleep
        assertFalse(new WalWake(() -> stream, 5_000).awaitChange(stream, 5_000));
        started = System.nanoTime();
        assertTrue(new WalWake(() -> stream, 50).sleepWhen(true));
        assertTrue(millisSince(started) >= 45, "slept, did not spin");
    }

    @Test
    void theLongestWaitMustBePositive() {
        assertThrows(IllegalArgumentException.class, () -> new WalWake(() -> stream, 0));
    }

    @Test
    void theMembersItReplacesAndReadsAreThereInThisDebezium() {
        assertNull(WalWake.missing());
        assertNotNull(WalWake.Members.DELAY);
        assertNotNull(WalWake.Members.inputOf(stream));
        assertFalse(WalWake.install(new Object(), 20), "only into Debezium's PostgreSQL streaming source");
    }

    /** A CopyData message of the replication protocol: 'd', length, then the payload. */
    private static byte[] copyData(byte[] payload) {
        return ByteBuffer.allocate(5 + payload.length).put((byte) 'd').putInt(4 + payload.length).put(payload).array();
    }

    /** A primary keepalive: 'k', the WAL end, the server's clock, whether a reply is asked for. */
    private static byte[] keepalive() {
        return copyData(ByteBuffer.allocate(18).put((byte) 'k').putLong(0x16B3_7A28L).putLong(1L).put((byte) 0).array());
    }

    /** A change: 'w', its start, the WAL end, the server's clock, then pgoutput's message. */
    private static byte[] xlogData() {
        return copyData(ByteBuffer.allocate(27).put((byte) 'w').putLong(1L).putLong(2L).putLong(3L).put((byte) 'B').put((byte) 0).array());
    }

    private static long millisSince(long startedNanos) {
        return (System.nanoTime() - startedNanos) / 1_000_000;
    }

    private void send(byte[]... messages) {
        try {
            OutputStream out = walsender.getOutputStream();
            for (byte[] message : messages) {
                out.write(message);
            }
            out.flush();
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }
}
