package dev.flotilla.connect;

import java.util.ArrayList;
import java.util.List;
import java.util.function.BooleanSupplier;

/**
 * Takes every event already queued, up to a cap, as one batch: without waiting for more.
 *
 * <p>Why: with Debezium's {@code max.batch.size=1} a lone row is handed over at once, but a
 * burst then costs one exactly-once transaction per row (about 60 rows a second per
 * connector here). A larger {@code max.batch.size} makes Debezium's poll wait for the batch
 * to fill. Draining what is there gives both: one row alone goes at once, and what piled up
 * while the last transaction committed goes in the next one.
 */
final class Drain {

    private Drain() {}

    /** {@code poll} (one event, never waiting when one is queued) while {@code queued} says more are there. */
    static <T> List<T> queued(IdlePoll.Poll<T> poll, BooleanSupplier queued, int cap) throws InterruptedException {
        if (cap < 1) {
            throw new IllegalArgumentException("a batch holds at least one event, got a cap of " + cap);
        }
        List<T> batch = new ArrayList<>(poll.poll());
        while (batch.size() < cap && queued.getAsBoolean()) {
            List<T> more = poll.poll();
            if (more.isEmpty()) {
                break;
            }
            batch.addAll(more);
        }
        return batch;
    }
}
