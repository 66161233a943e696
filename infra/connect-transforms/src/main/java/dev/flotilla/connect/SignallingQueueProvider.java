package dev.flotilla.connect;

import java.util.ArrayDeque;
import java.util.Map;
import java.util.Queue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import io.debezium.connector.base.QueueProvider;

/**
 * Debezium's in-memory event queue (a plain deque, as its own {@code memory} provider) that
 * also tells a waiting task when an event arrives.
 *
 * <p>Why: Debezium's {@code ChangeEventQueue.poll()} ends each empty wait by spinning on the
 * clock for up to a millisecond (its timer's {@code expired()} is strict while
 * {@code remaining()} is already zero), so a task polling every 20 ms burned about 5 % of a
 * core doing nothing. With this queue the task sleeps until there is an event and only then
 * lets Debezium drain it ({@link OutboxPostgresConnectorTask}).
 *
 * <p>Debezium finds providers by name ({@code queue.provider.type}) through the
 * {@link java.util.ServiceLoader} and creates one per task; {@link #QUEUE_ID_CONFIG}, which the
 * task puts into its own settings, is how the task finds the one made for it.
 * {@link #enqueue}, {@link #poll} and {@link #size} are called under Debezium's queue lock.
 */
public final class SignallingQueueProvider<T> implements QueueProvider<T> {

    public static final String NAME = "flotilla-signalling";
    public static final String QUEUE_ID_CONFIG = "flotilla.queue.id";

    private static final Map<String, SignallingQueueProvider<?>> BY_ID = new ConcurrentHashMap<>();

    private final Queue<T> events = new ArrayDeque<>();
    private final AtomicInteger pending = new AtomicInteger();
    private final Object arrived = new Object();

    @Override
    public String name() {
        return NAME;
    }

    @Override
    public void configure(Map<String, ?> properties) {
        Object id = properties.get(QUEUE_ID_CONFIG);
        if (id == null) {
            throw new IllegalStateException(
                    "the " + NAME + " queue needs " + QUEUE_ID_CONFIG + ": use it through " + OutboxPostgresConnector.class.getName());
        }
        BY_ID.put(id.toString(), this);
    }

    /** The queue Debezium made for the task that put {@code id} in its settings (once; null if none was). */
    static SignallingQueueProvider<?> take(String id) {
        return BY_ID.remove(id);
    }

    @Override
    public void enqueue(T event) {
        events.add(event);
        synchronized (arrived) {
            pending.incrementAndGet();
            arrived.notifyAll();
        }
    }

    @Override
    public T poll() {
        T event = events.poll();
        if (event != null) {
            pending.decrementAndGet();
        }
        return event;
    }

    @Override
    public int size() {
        return events.size();
    }

    /** Whether an event is queued now. */
    boolean hasEvent() {
        return pending.get() > 0;
    }

    /** Waits up to {@code timeoutNanos} for the queue to hold an event; true when it does. */
    boolean awaitEvent(long timeoutNanos) throws InterruptedException {
        long deadline = System.nanoTime() + timeoutNanos;
        synchronized (arrived) {
            while (pending.get() == 0) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return false;
                }
                TimeUnit.NANOSECONDS.timedWait(arrived, left);
            }
            return true;
        }
    }
}
