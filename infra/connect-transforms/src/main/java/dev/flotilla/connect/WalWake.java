package dev.flotilla.connect;

import java.io.IOException;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.net.SocketTimeoutException;
import java.util.function.Supplier;

import org.postgresql.core.BaseConnection;
import org.postgresql.core.PGStream;
import org.postgresql.core.QueryExecutorBase;
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
 * connection's socket for its next byte (a peek: nothing is consumed, the stream's next read
 * gets it), for at most the poll interval. So a row is read as soon as PostgreSQL sends it, and
 * an idle loop still wakes, checks its heartbeat and connection and whether the task stops, as
 * often as before and at no more cost.
 *
 * <p>Debezium has no setting for this: {@link #install} replaces the loop's private delay by
 * reflection, and the wait reaches pgjdbc's stream of the replication connection the same way,
 * each pinned to the versions the stack runs (tests check the members are there). When
 * anything is not where it is expected, the loop keeps Debezium's own sleep, and the task logs
 * why once.
 */
final class WalWake implements DelayStrategy {

    private static final Logger LOG = LoggerFactory.getLogger(WalWake.class);

    private final Supplier<PGStream> stream;
    private final int maxMillis;

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
        if (now == null || !awaitByte(now, maxMillis)) {
            sleep(maxMillis);
        }
        return true;
    }

    /**
     * Until {@code stream} has a byte to read or {@code millis} pass (true either way); false if
     * the stream cannot be waited on (closed, broken), for the caller to sleep instead: the
     * loop's next read reports what is wrong.
     */
    static boolean awaitByte(PGStream stream, int millis) {
        int previous;
        try {
            previous = stream.getNetworkTimeout();
        } catch (IOException e) {
            return false;
        }
        try {
            stream.setNetworkTimeout(millis);
            stream.peekChar();
            return true;
        } catch (SocketTimeoutException e) {
            return true; // nothing within the wait: what Debezium's sleep would have done
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
        static final String MISSING;

        static {
            Field delay = null;
            Field replicationConnection = null;
            Method pgConnection = null;
            Field pgStream = null;
            String missing = null;
            try {
                delay = PostgresStreamingChangeEventSource.class.getDeclaredField("pauseNoMessage");
                replicationConnection = PostgresStreamingChangeEventSource.class.getDeclaredField("replicationConnection");
                pgConnection = PostgresReplicationConnection.class.getDeclaredMethod("pgConnection");
                pgStream = QueryExecutorBase.class.getDeclaredField("pgStream");
                if (!DelayStrategy.class.equals(delay.getType())) {
                    throw new NoSuchFieldException("pauseNoMessage is a " + delay.getType().getName() + ", not a DelayStrategy");
                }
                for (var member : new java.lang.reflect.AccessibleObject[]{ delay, replicationConnection, pgConnection, pgStream }) {
                    member.setAccessible(true);
                }
            } catch (ReflectiveOperationException | RuntimeException e) {
                missing = e.toString();
            }
            DELAY = delay;
            REPLICATION_CONNECTION = replicationConnection;
            PG_CONNECTION = pgConnection;
            PG_STREAM = pgStream;
            MISSING = missing;
        }

        private Members() {
        }
    }
}
