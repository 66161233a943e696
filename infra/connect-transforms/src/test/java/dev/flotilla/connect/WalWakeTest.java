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
    void aByteEndsTheWaitAndIsLeftForTheReader() throws Exception {
        later.schedule(() -> send('w'), 200, TimeUnit.MILLISECONDS);
        long started = System.nanoTime();

        assertTrue(new WalWake(() -> stream, 30_000).sleepWhen(true));

        long waitedMillis = (System.nanoTime() - started) / 1_000_000;
        assertTrue(waitedMillis < 20_000, "woken by the byte, not by the longest wait: " + waitedMillis + " ms");
        assertEquals('w', stream.receiveChar()); // nothing consumed
        assertEquals(0, stream.getNetworkTimeout()); // the reader's timeout is back
    }

    @Test
    void withoutAByteItWaitsAtMostTheLongestWait() throws Exception {
        stream.setNetworkTimeout(7_000);

        assertTrue(new WalWake(() -> stream, 50).sleepWhen(true));

        assertEquals(7_000, stream.getNetworkTimeout());
        send('k');
        assertEquals('k', stream.receiveChar()); // the stream still reads after a timed-out wait
    }

    @Test
    void noCriteriaNoWait() {
        assertFalse(new WalWake(() -> { throw new AssertionError("looked for the stream"); }, 60_000).sleepWhen(false));
    }

    @Test
    void noStreamOrABrokenOneSleepsInstead() throws Exception {
        long started = System.nanoTime();
        assertTrue(new WalWake(() -> null, 50).sleepWhen(true));
        assertTrue((System.nanoTime() - started) / 1_000_000 >= 45);

        walsender.close(); // end of stream: the peek fails at once, the wait falls back to a sleep
        assertFalse(WalWake.awaitByte(stream, 5_000));
        started = System.nanoTime();
        assertTrue(new WalWake(() -> stream, 50).sleepWhen(true));
        assertTrue((System.nanoTime() - started) / 1_000_000 >= 45, "slept, did not spin");
    }

    @Test
    void theLongestWaitMustBePositive() {
        assertThrows(IllegalArgumentException.class, () -> new WalWake(() -> stream, 0));
    }

    @Test
    void theMembersItReplacesAndReadsAreThereInThisDebezium() {
        assertNull(WalWake.missing());
        assertNotNull(WalWake.Members.DELAY);
        assertFalse(WalWake.install(new Object(), 20), "only into Debezium's PostgreSQL streaming source");
    }

    private void send(char c) {
        try {
            OutputStream out = walsender.getOutputStream();
            out.write(c);
            out.flush();
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }
}
