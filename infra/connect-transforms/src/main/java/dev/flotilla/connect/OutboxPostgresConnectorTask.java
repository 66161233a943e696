package dev.flotilla.connect;

import java.util.List;
import java.util.UUID;

import org.apache.kafka.connect.source.SourceRecord;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import io.debezium.config.CommonConnectorConfig;
import io.debezium.config.Configuration;
import io.debezium.connector.common.DebeziumTaskState;
import io.debezium.connector.postgresql.PostgresConnectorTask;
import io.debezium.connector.postgresql.PostgresOffsetContext;
import io.debezium.connector.postgresql.PostgresPartition;
import io.debezium.pipeline.ChangeEventSourceCoordinator;

/**
 * Debezium's PostgreSQL task, made cheap while its outbox is idle; rows pass as fast as before.
 *
 * <p>Three costs of an idle Debezium task under an exactly-once Connect worker, and what this
 * task does about each:
 * <ul>
 *   <li>With {@code max.batch.size=1} (a lone row must not wait for a batch to fill) a burst
 *       would cost a transaction per row: the task takes every event already queued into
 *       one batch instead ({@link Drain}).
 *   <li>Every return from {@code poll()} ends a transaction, and the {@code commit()} after it
 *       makes Debezium read the offsets topic to its end to flush the slot's position: a few
 *       broker round trips. The task returns with rows at once, but empty only after
 *       {@value OutboxPostgresConnector#IDLE_RETURN_CONFIG} ({@link IdlePoll}).
 *   <li>Debezium's queue poll spins on the clock at the end of each empty wait. The task waits
 *       on its {@link SignallingQueueProvider} instead and asks Debezium only when an event is
 *       there (and once per idle return, so a failure of the WAL reader still surfaces).
 *   <li>The slot flush runs at most once per idle-return time, also under a burst: it only lets
 *       PostgreSQL recycle WAL already published; a restart resumes from the offset committed
 *       in Kafka, so deferring it never loses or repeats a row.
 * </ul>
 * And one cost to a row: Debezium's WAL reader sleeps {@code poll.interval.ms} whenever the WAL
 * ran dry, so a row committed meanwhile waits for the sleep to end. The task has the reader
 * wait on its replication socket instead ({@link WalWake}), for at most
 * {@value OutboxPostgresConnector#WAL_WAIT_CONFIG}.
 */
public class OutboxPostgresConnectorTask extends PostgresConnectorTask {

    /** How long one wait for an event lasts before the task checks it is still running. */
    private static final long WAIT_SLICE_NANOS = 100_000_000L;
    /** The most events one batch (one exactly-once transaction) takes: Debezium's default max.batch.size. */
    static final int BATCH_CAP = 2048;

    private IdlePoll idlePoll = new IdlePoll(OutboxPostgresConnector.IDLE_RETURN_DEFAULT_MS, System::nanoTime);
    private Throttle slotFlush = new Throttle(OutboxPostgresConnector.IDLE_RETURN_DEFAULT_MS, System::nanoTime);
    private volatile SignallingQueueProvider<?> events;
    private ChangeEventSourceCoordinator<PostgresPartition, PostgresOffsetContext> coordinator;
    private long walWaitMillis;
    /** The streaming source {@link WalWake} was last put in (or failed to be): each is tried once. */
    private Object wokenSource;

    private static final Logger LOG = LoggerFactory.getLogger(OutboxPostgresConnectorTask.class);

    @Override
    public ChangeEventSourceCoordinator<PostgresPartition, PostgresOffsetContext> start(Configuration config) {
        long idleMillis = OutboxPostgresConnector.idleReturnMillis(config.asMap());
        idlePoll = new IdlePoll(idleMillis, System::nanoTime);
        slotFlush = new Throttle(idleMillis, System::nanoTime);
        String queueId = UUID.randomUUID().toString();
        Configuration withOurQueue = config.edit()
                .with(CommonConnectorConfig.QUEUE_PROVIDER_TYPE, SignallingQueueProvider.NAME)
                .with(SignallingQueueProvider.QUEUE_ID_CONFIG, queueId)
                .build();
        walWaitMillis = OutboxPostgresConnector.walWaitMillis(config.asMap());
        wokenSource = null;
        coordinator = super.start(withOurQueue);
        SignallingQueueProvider<?> made = SignallingQueueProvider.take(queueId);
        if (made == null) {
            throw new IllegalStateException("Debezium did not create the " + SignallingQueueProvider.NAME + " queue this task asked for");
        }
        events = made;
        return coordinator;
    }

    @Override
    public List<SourceRecord> doPoll() throws InterruptedException {
        wakeTheWalReader();
        List<SourceRecord> batch = idlePoll.next(this::pollWhenThereIsAnEvent, this::running);
        // Idle: Debezium's own poll once, which throws what the WAL reader failed with.
        return batch.isEmpty() ? super.doPoll() : batch;
    }

    /**
     * Once an event is queued, every event queued (up to {@link #BATCH_CAP}) through Debezium's
     * poll, one at a time ({@link Drain}); after one wait slice without one, an empty batch.
     */
    private List<SourceRecord> pollWhenThereIsAnEvent() throws InterruptedException {
        SignallingQueueProvider<?> queue = events;
        if (queue == null || !running()) {
            return super.doPoll();
        }
        if (!queue.awaitEvent(WAIT_SLICE_NANOS)) {
            return List.of();
        }
        return Drain.queued(super::doPoll, queue::hasEvent, BATCH_CAP);
    }

    /**
     * Puts {@link WalWake} in the streaming source once it exists (after the snapshot), and in
     * each new one Debezium makes; a look at a field per poll otherwise.
     */
    private void wakeTheWalReader() {
        ChangeEventSourceCoordinator<PostgresPartition, PostgresOffsetContext> running = coordinator;
        Object source = running == null ? null : running.getStreamingSource().orElse(null);
        if (source == null || source == wokenSource) {
            return;
        }
        wokenSource = source;
        if (walWaitMillis == 0) {
            LOG.info("Debezium's WAL reader keeps its own sleep (poll.interval.ms): {} is 0", OutboxPostgresConnector.WAL_WAIT_CONFIG);
        } else if (WalWake.install(source, walWaitMillis)) {
            LOG.info("Debezium's WAL reader waits on its replication socket (at most {} ms) instead of sleeping", walWaitMillis);
        } else {
            LOG.warn("Debezium's WAL reader keeps its own sleep (poll.interval.ms): {}",
                    WalWake.missing() != null ? WalWake.missing() : "its streaming source is not the one this version expects");
        }
    }

    private boolean running() {
        return getTaskState() == DebeziumTaskState.RUNNING;
    }

    @Override
    public void performCommit() {
        if (slotFlush.tryAcquire()) {
            super.performCommit();
        } else {
            // Not now: ask again, so the position is flushed after a later poll that may.
            shouldPerformCommit.set(true);
        }
    }
}
