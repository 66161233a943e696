package dev.flotilla.connect;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.connect.source.ExactlyOnceSupport;
import org.junit.jupiter.api.Test;

import io.debezium.connector.postgresql.PostgresConnector;

class OutboxPostgresConnectorTest {

    @Test
    void runsOurTaskAndKeepsDebeziumsExactlyOnceSupport() {
        OutboxPostgresConnector connector = new OutboxPostgresConnector();

        assertSame(OutboxPostgresConnectorTask.class, connector.taskClass());
        assertEquals(
                new PostgresConnector().exactlyOnceSupport(Map.of()),
                connector.exactlyOnceSupport(Map.of()));
        assertEquals(ExactlyOnceSupport.SUPPORTED, connector.exactlyOnceSupport(Map.of()));
    }

    @Test
    void declaresTheIdleReturnBesideDebeziumsSettingsWithoutChangingThem() {
        ConfigDef ours = new OutboxPostgresConnector().config();
        ConfigDef debeziums = new PostgresConnector().config();

        assertTrue(ours.names().contains(OutboxPostgresConnector.IDLE_RETURN_CONFIG));
        assertTrue(ours.names().contains(OutboxPostgresConnector.WAL_WAIT_CONFIG));
        assertTrue(ours.names().containsAll(debeziums.names()));
        assertTrue(!debeziums.names().contains(OutboxPostgresConnector.IDLE_RETURN_CONFIG));
        // Asked twice, it is still one definition (no "defined twice" from a shared ConfigDef).
        assertEquals(ours.names(), new OutboxPostgresConnector().config().names());
    }

    @Test
    void readsTheIdleReturnAndRefusesNonsense() {
        String key = OutboxPostgresConnector.IDLE_RETURN_CONFIG;
        assertEquals(1000, OutboxPostgresConnector.idleReturnMillis(Map.of()));
        assertEquals(250, OutboxPostgresConnector.idleReturnMillis(Map.of(key, " 250 ")));
        assertEquals(0, OutboxPostgresConnector.idleReturnMillis(Map.of(key, "0")));

        ConfigException notANumber = assertThrows(ConfigException.class, () -> OutboxPostgresConnector.idleReturnMillis(Map.of(key, "1s")));
        assertTrue(notANumber.getMessage().contains("1s"));
        assertThrows(ConfigException.class, () -> OutboxPostgresConnector.idleReturnMillis(Map.of(key, "-1")));
        assertEquals(4000, OutboxPostgresConnector.idleReturnMillis(Map.of(key, "4000")));
        assertThrows(ConfigException.class, () -> OutboxPostgresConnector.idleReturnMillis(Map.of(key, "4001")));
    }

    @Test
    void readsTheWalWaitAndRefusesNonsense() {
        String key = OutboxPostgresConnector.WAL_WAIT_CONFIG;
        assertEquals(500, OutboxPostgresConnector.walWaitMillis(Map.of()));
        assertEquals(20, OutboxPostgresConnector.walWaitMillis(Map.of(key, "20")));
        assertEquals(0, OutboxPostgresConnector.walWaitMillis(Map.of(key, "0"))); // off: Debezium's sleep
        assertThrows(ConfigException.class, () -> OutboxPostgresConnector.walWaitMillis(Map.of(key, "-1")));
        assertThrows(ConfigException.class, () -> OutboxPostgresConnector.walWaitMillis(Map.of(key, "4001")));
        assertThrows(ConfigException.class, () -> OutboxPostgresConnector.walWaitMillis(Map.of(key, "soon")));
    }
}
