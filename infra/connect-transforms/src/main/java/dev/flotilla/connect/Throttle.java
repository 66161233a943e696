package dev.flotilla.connect;

import java.util.function.LongSupplier;

/** Lets something happen at most once per period (the first time always). */
final class Throttle {

    private final long periodNanos;
    private final LongSupplier nanoClock;
    private long last;
    private boolean never = true;

    Throttle(long periodMillis, LongSupplier nanoClock) {
        if (periodMillis < 0) {
            throw new IllegalArgumentException("the period must not be negative, got " + periodMillis + " ms");
        }
        this.periodNanos = periodMillis * 1_000_000L;
        this.nanoClock = nanoClock;
    }

    /** True (and the period restarts) when a period has passed since the last true. */
    synchronized boolean tryAcquire() {
        long now = nanoClock.getAsLong();
        if (never || now - last >= periodNanos) {
            never = false;
            last = now;
            return true;
        }
        return false;
    }
}
