package dev.flotilla.connect;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.ArrayDeque;
import java.util.Deque;
import java.util.List;

import org.junit.jupiter.api.Test;

class DrainTest {

    /** Debezium's poll with max.batch.size=1 over a queue: one event per call, empty when none. */
    private static final class OneAtATime implements IdlePoll.Poll<String> {
        final Deque<String> queue = new ArrayDeque<>();
        int calls;

        OneAtATime(String... events) {
            queue.addAll(List.of(events));
        }

        @Override
        public List<String> poll() {
            calls++;
            String event = queue.poll();
            return event == null ? List.of() : List.of(event);
        }
    }

    @Test
    void everyQueuedEventGoesInOneBatchInOrder() throws InterruptedException {
        OneAtATime poll = new OneAtATime("a", "b", "c");
        assertEquals(List.of("a", "b", "c"), Drain.queued(poll, () -> !poll.queue.isEmpty(), 2048));
        assertEquals(3, poll.calls);
    }

    @Test
    void aLoneEventIsNotHeldForMore() throws InterruptedException {
        OneAtATime poll = new OneAtATime("a");
        assertEquals(List.of("a"), Drain.queued(poll, () -> !poll.queue.isEmpty(), 2048));
        assertEquals(1, poll.calls);
    }

    @Test
    void theCapEndsABatchAndTheRestWaitsForTheNext() throws InterruptedException {
        OneAtATime poll = new OneAtATime("a", "b", "c", "d", "e");
        assertEquals(List.of("a", "b"), Drain.queued(poll, () -> !poll.queue.isEmpty(), 2));
        assertEquals(List.of("c", "d"), Drain.queued(poll, () -> !poll.queue.isEmpty(), 2));
        assertEquals(List.of("e"), Drain.queued(poll, () -> !poll.queue.isEmpty(), 2));
    }

    @Test
    void anEmptyPollEndsTheBatchEvenIfTheCountSaidMore() throws InterruptedException {
        OneAtATime poll = new OneAtATime("a");
        assertEquals(List.of("a"), Drain.queued(poll, () -> true, 2048));
        assertEquals(2, poll.calls);
    }

    @Test
    void aCapBelowOneIsRefused() {
        assertThrows(IllegalArgumentException.class, () -> Drain.queued(new OneAtATime(), () -> false, 0));
    }
}
