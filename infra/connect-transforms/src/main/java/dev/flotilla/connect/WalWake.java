package dev.flotilla.connect;

import java.io.IOException;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.net.SocketTimeoutException;
import java.util.function.Supplier;

import org.postgresql.core.BaseConnection;
import org.postgresql.core.PGStream;
import org.postgresql.core.QueryExecutorBase;
import org.postgresql.core.VisibleBufferedInputStream;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import io.debezium.connector.postgresql.PostgresStreamingChangeEventSource;
import io.debezium.connector.postgresql.connection.PostgresReplicationConnection;
import io.debezium.util.DelayStrategy;

/**
 * Debezium's WAL reader, woken by the WAL rather than by a clock.
 *
 * <p>Debezium's PostgreSQL streaming loop asks the replication stream for a message without
 * blocking, and after five empty asks sleeps {@code poll.interval.ms}. A row committed during
 * that sleep waits for its end: at 20 ms it was 8 ms of a 16 ms hop at the median
 * ({@code benchmarks/hop_stages.py}). In place of the sleep, this waits on the replication
 * connection's socket until PostgreSQL sends a change (it looks into the stream's buffer and
 * consumes nothing: the stream's next read gets it), for at most
 * {@value OutboxPostgresConnector#WAL_WAIT_CONFIG}. So a row is read as soon as PostgreSQL sends
 * it, keepalives do not wake the loop ({@link #awaitChange}), and an idle loop still wakes,
 * checks its heartbeat and connection and whether the task stops, a few times a second.
 *
 * <p>Debezium has no setting for this: {@link #install} replaces the loop's private delay by
 * reflection, and the wait reaches pgjdbc's stream of the replication connection the same way,
 * each pinned to the versions the stack runs (tests check the members are there). When
 * anything is not where it is expected, the loop keeps Debezium's own sleep, and the task logs
 * why once.
 */
final class WalWake implements DelayStrategy {

    private static final Logger LOG = LoggerFactory.getLogger(WalWake.class);

    /** Keepalives left in the buffer before the reader is woken to take them (23 bytes each on the wire). */
    static final int KEEPALIVE_BYTES = 64 * 1024;
    /**
     * How long the wait pauses after keepalives before it reads the socket again: the shortest,
     * doubled while each pause gathers more than two, up to the longest.
     */
    static final int KEEPALIVE_PAUSE_MS = 2;
    static final int KEEPALIVE_PAUSE_MAX_MS = 8;

    private final Supplier<PGStream> stream;
    private final int maxMillis;
    private int pauseMillis = KEEPALIVE_PAUSE_MS; // only the loop's thread waits

    /** {@code stream}: the replication connection's stream now, or null when there is none to wait on. */
    WalWake(Supplier<PGStream> stream, long maxMillis) {
        if (maxMillis <= 0 || maxMillis > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("the longest wait must be positive, got " + maxMillis + " ms");
        }
        this.stream = stream;
        this.maxMillis = (int) maxMillis;
    }

    @Override
    public boolean sleepWhen(boolean criteria) {
        if (!criteria) {
            return false;
        }
        PGStream now = stream.get();
        if (now == null || !awaitChange(now, maxMillis)) {
            sleep(maxMillis);
        }
        return true;
    }

    /**
     * Until {@code stream} has a change to read (a message other than a keepalive) or
     * {@code millis} pass (true either way); false if the stream cannot be waited on (closed,
     * broken, not the stream this expects), for the caller to sleep instead: the loop's next
     * read reports what is wrong.
     *
     * <p>Keepalives do not end the wait. A logical walsender sends one to every slot each time
     * it has caught up with the WAL and its client has not confirmed the newest position,
     * which Debezium does only every few seconds: so every transaction of the cluster, in any
     * database, reaches every reader as a keepalive. Waking on each made seven readers cost a
     * third of a core under another database's 2,500 transactions a second. They stay in the
     * buffer, unread, and the stream's next read takes them all at once. After one, the wait
     * pauses before it reads the socket again ({@value #KEEPALIVE_PAUSE_MS} ms, doubled while
     * the keepalives come faster than that, up to {@value #KEEPALIVE_PAUSE_MAX_MS}), so a busy
     * cluster wakes the reader about as often as Debezium's own poll did, and a change waits at
     * most that pause longer; a quiet one, not at all.
     */
    boolean awaitChange(PGStream stream, int millis) {
        VisibleBufferedInputStream input = Members.inputOf(stream);
        if (input == null) {
            return false;
        }
        int previous;
        try {
            previous = stream.getNetworkTimeout();
        } catch (IOException e) {
            return false;
        }
        long deadline = System.nanoTime() + millis * 1_000_000L;
        int skipped = 0; // bytes of keepalives at the head of the buffer, looked at already
        int gathered = 0; // keepalives seen since the last pause
        try {
            while (true) {
                long left = (deadline - System.nanoTime()) / 1_000_000L;
                if (left <= 0) {
                    return true;
                }
                if (skipped > 0 && input.available() < skipped + 6) {
                    // Keepalives only so far: let the next ones gather in the socket's buffer
                    // rather than waking for each (a change waits this much longer at most).
                    pauseMillis = gathered > 2 ? Math.min(pauseMillis * 2, KEEPALIVE_PAUSE_MAX_MS) : KEEPALIVE_PAUSE_MS;
                    gathered = 0;
                    sleep((int) Math.min(pauseMillis, left));
                    left = Math.max(1, (deadline - System.nanoTime()) / 1_000_000L);
                }
                stream.setNetworkTimeout((int) left);
                // A CopyData message: 'd', its length (4 bytes, itself included), then its kind.
                if (!input.ensureBytes(skipped + 6)) {
                    return false; // end of stream
                }
                byte[] buffer = input.getBuffer();
                int at = input.getIndex() + skipped;
                if (buffer[at] != 'd' || buffer[at + 5] != 'k') {
                    return true; // a change, or anything else: the reader's business
                }
                int length = ((buffer[at + 1] & 0xFF) << 24) | ((buffer[at + 2] & 0xFF) << 16)
                        | ((buffer[at + 3] & 0xFF) << 8) | (buffer[at + 4] & 0xFF);
                skipped += 1 + length;
                gathered++;
                if (length < 5 || skipped > KEEPALIVE_BYTES) {
                    return true; // let the reader take them (or report a message it cannot parse)
                }
            }
        } catch (SocketTimeoutException e) {
            return true; // nothing but keepalives within the wait: what Debezium's sleep would have done
        } catch (IOException e) {
            return false;
        } finally {
            try {
                stream.setNetworkTimeout(previous);
            } catch (IOException e) {
                // the socket is gone; the next read says so
            }
        }
    }

    private static void sleep(int millis) {
        try {
            Thread.sleep(millis);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt(); // as Debezium's own delay does
        }
    }

    // -- putting it in Debezium's loop --------------------------------------------------

    /** Why {@link #install} could not, or null when it could. */
    static String missing() {
        return Members.MISSING;
    }

    /**
     * Puts a wait of at most {@code maxMillis} in place of {@code source}'s sleep, once; true if
     * it is there (now or before), false if {@code source} is not Debezium's PostgreSQL loop or
     * its members are not where this expects them ({@link #missing} says which).
     */
    static boolean install(Object source, long maxMillis) {
        if (Members.MISSING != null || !(source instanceof PostgresStreamingChangeEventSource)) {
            return false;
        }
        try {
            if (Members.DELAY.get(source) instanceof WalWake) {
                return true;
            }
            Object connection = Members.REPLICATION_CONNECTION.get(source);
            if (!(connection instanceof PostgresReplicationConnection replication)) {
                return false;
            }
            Members.DELAY.set(source, new WalWake(() -> streamOf(replication), maxMillis));
            return true;
        } catch (IllegalAccessException | RuntimeException e) {
            LOG.warn("cannot wake Debezium's WAL reader on the socket ({}); it keeps its own sleep", e.toString());
            return false;
        }
    }

    /** The stream under the replication connection, or null while it is not connected. */
    private static PGStream streamOf(PostgresReplicationConnection replication) {
        try {
            if (!replication.isConnected()) {
                return null; // do not (re)connect from here: the loop does that
            }
            BaseConnection connection = (BaseConnection) Members.PG_CONNECTION.invoke(replication);
            return connection.getQueryExecutor() instanceof QueryExecutorBase executor
                    ? (PGStream) Members.PG_STREAM.get(executor)
                    : null;
        } catch (ReflectiveOperationException | java.sql.SQLException | RuntimeException e) {
            return null;
        }
    }

    /** The private members this reaches, looked up once. */
    static final class Members {
        static final Field DELAY;
        static final Field REPLICATION_CONNECTION;
        static final Method PG_CONNECTION;
        static final Field PG_STREAM;
        static final Field PG_INPUT;
        static final String MISSING;

        static {
            Field delay = null;
            Field replicationConnection = null;
            Method pgConnection = null;
            Field pgStream = null;
            Field pgInput = null;
            String missing = null;
            try {
                delay = PostgresStreamingChangeEventSource.class.getDeclaredField("pauseNoMessage");
                replicationConnection = PostgresStreamingChangeEventSource.class.getDeclaredField("replicationConnection");
                pgConnection = PostgresReplicationConnection.class.getDeclaredMethod("pgConnection");
                pgStream = QueryExecutorBase.class.getDeclaredField("pgStream");
                pgInput = PGStream.class.getDeclaredField("pgInput");
                if (!VisibleBufferedInputStream.class.equals(pgInput.getType())) {
                    throw new NoSuchFieldException("PGStream.pgInput is a " + pgInput.getType().getName());
                }
                if (!DelayStrategy.class.equals(delay.getType())) {
                    throw new NoSuchFieldException("pauseNoMessage is a " + delay.getType().getName() + ", not a DelayStrategy");
                }
                for (var member : new java.lang.reflect.AccessibleObject[]{ delay, replicationConnection, pgConnection, pgStream, pgInput }) {
                    member.setAccessible(true);
                }
            } catch (ReflectiveOperationException | RuntimeException e) {
                missing = e.toString();
            }
            DELAY = delay;
            REPLICATION_CONNECTION = replicationConnection;
            PG_CONNECTION = pgConnection;
            PG_STREAM = pgStream;
            PG_INPUT = pgInput;
            MISSING = missing;
        }

        /** The stream's buffered input (replaced when its socket is), or null if it cannot be had. */
        static VisibleBufferedInputStream inputOf(PGStream stream) {
            try {
                return PG_INPUT == null ? null : (VisibleBufferedInputStream) PG_INPUT.get(stream);
            } catch (IllegalAccessException | RuntimeException e) {
                return null;
            }
        }

        private Members() {
        }
    }
}
