package dev.flotilla.connect;

import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.common.config.ConfigException;
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
 * soon as Debezium's own poll ({@code poll.interval.ms}) returns it.
 */
public class OutboxPostgresConnector extends PostgresConnector {

    public static final String IDLE_RETURN_CONFIG = "flotilla.idle.return.ms";
    public static final long IDLE_RETURN_DEFAULT_MS = 1000;

    @Override
    public Class<? extends Task> taskClass() {
        return OutboxPostgresConnectorTask.class;
    }

    @Override
    public ConfigDef config() {
        // A copy: Debezium's definition is shared by every connector instance.
        return new ConfigDef(super.config()).define(
                IDLE_RETURN_CONFIG,
                ConfigDef.Type.LONG,
                IDLE_RETURN_DEFAULT_MS,
                ConfigDef.Range.between(0, 60_000),
                ConfigDef.Importance.LOW,
                "How long an idle task keeps polling for a row before it returns an empty batch to the worker (ms). "
                        + "Every return ends an exactly-once transaction and flushes the slot, so a longer time is cheaper while idle; "
                        + "a row is never held for it.");
    }

    /** {@value #IDLE_RETURN_CONFIG} from a task's settings, checked. */
    static long idleReturnMillis(Map<String, String> settings) {
        String raw = settings.get(IDLE_RETURN_CONFIG);
        if (raw == null || raw.isBlank()) {
            return IDLE_RETURN_DEFAULT_MS;
        }
        long value;
        try {
            value = Long.parseLong(raw.trim());
        } catch (NumberFormatException e) {
            throw new ConfigException(IDLE_RETURN_CONFIG, raw, "not a whole number of milliseconds");
        }
        if (value < 0 || value > 60_000) {
            throw new ConfigException(IDLE_RETURN_CONFIG, raw, "must be between 0 and 60000 ms");
        }
        return value;
    }
}
