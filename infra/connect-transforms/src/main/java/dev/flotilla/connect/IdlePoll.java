package dev.flotilla.connect;

import java.util.List;
import java.util.function.BooleanSupplier;
import java.util.function.LongSupplier;

/**
 * Repeats a short poll until it returns something, the idle time is up, or the task stops.
 *
 * <p>Why: Kafka Connect ends a transaction after every poll of an exactly-once source task
 * and then calls the task's {@code commit()}, after which Debezium reads the offsets topic to
 * its end to flush the replication slot's position: a few broker round trips per poll. A
 * poll that waits 20 ms for a row (so a hop stays fast) paid that 50 times a second per idle
 * connector. Polling again inside the task keeps the hop as fast and hands Connect an empty
 * batch only once per idle time.
 */
final class IdlePoll {

    /** One short poll: a batch, empty when nothing arrived in time. */
    @FunctionalInterface
    interface Poll<T> {
        List<T> poll() throws InterruptedException;
    }

    private final long idleNanos;
    private final LongSupplier nanoClock;

    IdlePoll(long idleMillis, LongSupplier nanoClock) {
        if (idleMillis < 0) {
            throw new IllegalArgumentException("the idle time must not be negative, got " + idleMillis + " ms");
        }
        this.idleNanos = idleMillis * 1_000_000L;
        this.nanoClock = nanoClock;
    }

    /**
     * The first non-empty batch of {@code poll}; an empty one once {@code idleMillis} have
     * passed, or as soon as {@code running} turns false (so a stopping task is never held).
     */
    <T> List<T> next(Poll<T> poll, BooleanSupplier running) throws InterruptedException {
        long started = nanoClock.getAsLong();
        while (true) {
            List<T> batch = poll.poll();
            if (!batch.isEmpty() || !running.getAsBoolean() || nanoClock.getAsLong() - started >= idleNanos) {
                return batch;
            }
        }
    }
}
