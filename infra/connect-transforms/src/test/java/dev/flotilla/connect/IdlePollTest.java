package dev.flotilla.connect;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayDeque;
import java.util.Deque;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

import org.junit.jupiter.api.Test;

class IdlePollTest {

    /** A poll that answers from a script and moves a fake clock 20 ms per call, as Debezium's would. */
    private static final class ScriptedPoll implements IdlePoll.Poll<String> {
        final AtomicLong clock = new AtomicLong();
        final Deque<List<String>> answers = new ArrayDeque<>();
        int calls;

        ScriptedPoll answer(List<String> batch) {
            answers.add(batch);
            return this;
        }

        @Override
        public List<String> poll() {
            calls++;
            clock.addAndGet(20_000_000L);
            return answers.isEmpty() ? List.of() : answers.poll();
        }
    }

    @Test
    void aRowIsHandedOverByThePollThatFoundIt() throws InterruptedException {
        ScriptedPoll poll = new ScriptedPoll().answer(List.of()).answer(List.of()).answer(List.of("row-1"));
        IdlePoll idle = new IdlePoll(1000, poll.clock::get);

        assertEquals(List.of("row-1"), idle.next(poll, () -> true));
        assertEquals(3, poll.calls);
        assertEquals(60_000_000L, poll.clock.get());
    }

    @Test
    void anIdleTaskReturnsEmptyOncePerIdleTimeNotOncePerShortPoll() throws InterruptedException {
        ScriptedPoll poll = new ScriptedPoll();
        IdlePoll idle = new IdlePoll(1000, poll.clock::get);

        assertEquals(List.of(), idle.next(poll, () -> true));
        assertEquals(50, poll.calls, "1,000 ms of 20 ms polls");
    }

    @Test
    void aStoppingTaskIsNotHeld() throws InterruptedException {
        ScriptedPoll poll = new ScriptedPoll();
        IdlePoll idle = new IdlePoll(60_000, poll.clock::get);

        assertEquals(List.of(), idle.next(poll, () -> poll.calls < 3));
        assertEquals(3, poll.calls);
    }

    @Test
    void zeroIdleTimeIsOnePollPerReturn() throws InterruptedException {
        ScriptedPoll poll = new ScriptedPoll();

        assertEquals(List.of(), new IdlePoll(0, poll.clock::get).next(poll, () -> true));
        assertEquals(1, poll.calls);
    }

    @Test
    void aNegativeIdleTimeIsRefused() {
        IllegalArgumentException error = assertThrows(IllegalArgumentException.class, () -> new IdlePoll(-1, System::nanoTime));
        assertTrue(error.getMessage().contains("-1"));
    }
}
