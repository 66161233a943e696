package dev.flotilla.connect;

import java.util.Map;

import org.apache.kafka.common.config.AbstractConfig;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;

import io.debezium.connector.postgresql.PostgresConnector;

/**
 * Debezium's PostgreSQL connector with a task that is cheap while its outbox is idle
 * ({@link OutboxPostgresConnectorTask}); everything else, exactly-once support included,
 * is Debezium's.
 *
 * <p>Lives in Debezium's plugin folder (its classes must be visible), not in a plugin of its own.
 *
 * <p>Configuration, besides Debezium's: {@value #IDLE_RETURN_CONFIG}, how long the task keeps
 * polling for a row before it hands the worker an empty batch (default
 * {@value #IDLE_RETURN_DEFAULT_MS} ms). It does not delay a row: a row is handed over as
 * soon as Debezium's own poll ({@code poll.interval.ms}) returns it. And
 * {@value #WAL_WAIT_CONFIG}: the longest the WAL reader waits on its replication socket when
 * the WAL ran dry ({@link WalWake}; default {@value #WAL_WAIT_DEFAULT_MS} ms). A row ends the
 * wait, so this bounds only how often an idle reader looks around; {@code poll.interval.ms}
 * remains the sleep of a Debezium this task cannot reach into, and where this is 0.
 */
public class OutboxPostgresConnector extends PostgresConnector {

    public static final String IDLE_RETURN_CONFIG = "flotilla.idle.return.ms";
    public static final long IDLE_RETURN_DEFAULT_MS = 1000;
    public static final String WAL_WAIT_CONFIG = "flotilla.wal.wait.ms";
    public static final long WAL_WAIT_DEFAULT_MS = 500;

    /** Our settings alone: added to Debezium's in {@link #config()}, and how a task reads them. */
    static final ConfigDef OWN_CONFIG = new ConfigDef().define(
            IDLE_RETURN_CONFIG,
            ConfigDef.Type.LONG,
            IDLE_RETURN_DEFAULT_MS,
            // Connect looks whether a source task should stop only between polls, and gives up
            // on a graceful stop after task.shutdown.graceful.timeout.ms (5 s by default).
            ConfigDef.Range.between(0, 4_000),
            ConfigDef.Importance.LOW,
            "How long an idle task keeps polling for a row before it returns an empty batch to the worker (ms). "
                    + "Every return ends an exactly-once transaction and flushes the slot, so a longer time is cheaper while idle; "
                    + "a row is never held for it. At most 4000: the worker stops a task only between polls.")
            .define(
                    WAL_WAIT_CONFIG,
                    ConfigDef.Type.LONG,
                    WAL_WAIT_DEFAULT_MS,
                    // The reader checks whether the task stops only between waits; 0 turns the wait off.
                    ConfigDef.Range.between(0, 4_000),
                    ConfigDef.Importance.LOW,
                    "The longest the WAL reader waits on its replication socket for the next change when the WAL ran dry (ms). "
                            + "A change ends the wait at once, so this is not a row's latency: only how often an idle reader "
                            + "checks its heartbeat, its connection and whether to stop. 0: Debezium's own sleep of "
                            + "poll.interval.ms, as also for a Debezium whose reader this plugin cannot reach (it logs a warning then).");

    @Override
    public Class<? extends Task> taskClass() {
        return OutboxPostgresConnectorTask.class;
    }

    @Override
    public ConfigDef config() {
        // A copy: Debezium's definition is shared by every connector instance.
        ConfigDef config = new ConfigDef(super.config());
        OWN_CONFIG.configKeys().values().forEach(config::define);
        return config;
    }

    /** {@value #IDLE_RETURN_CONFIG} from a task's settings, checked as {@link #OWN_CONFIG} says. */
    static long idleReturnMillis(Map<String, String> settings) {
        return new AbstractConfig(OWN_CONFIG, settings, false).getLong(IDLE_RETURN_CONFIG);
    }

    /** {@value #WAL_WAIT_CONFIG} from a task's settings, checked as {@link #OWN_CONFIG} says. */
    static long walWaitMillis(Map<String, String> settings) {
        return new AbstractConfig(OWN_CONFIG, settings, false).getLong(WAL_WAIT_CONFIG);
    }
}
