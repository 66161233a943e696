package dev.flotilla.connect;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.atomic.AtomicLong;

import org.junit.jupiter.api.Test;

class ThrottleTest {

    private static final long MS = 1_000_000L;

    @Test
    void theFirstTimeAlwaysPassesThenOncePerPeriod() {
        AtomicLong clock = new AtomicLong(-5 * MS); // nanoTime may be negative
        Throttle throttle = new Throttle(1000, clock::get);

        assertTrue(throttle.tryAcquire());
        clock.addAndGet(999 * MS);
        assertFalse(throttle.tryAcquire());
        clock.addAndGet(MS);
        assertTrue(throttle.tryAcquire());
        assertFalse(throttle.tryAcquire());
    }

    @Test
    void aRefusalDoesNotRestartThePeriod() {
        AtomicLong clock = new AtomicLong();
        Throttle throttle = new Throttle(1000, clock::get);

        assertTrue(throttle.tryAcquire());
        for (int i = 0; i < 9; i++) {
            clock.addAndGet(100 * MS);
            assertFalse(throttle.tryAcquire());
        }
        clock.addAndGet(100 * MS);
        assertTrue(throttle.tryAcquire());
    }

    @Test
    void zeroPeriodAlwaysPasses() {
        Throttle throttle = new Throttle(0, new AtomicLong()::get);
        assertTrue(throttle.tryAcquire());
        assertTrue(throttle.tryAcquire());
    }

    @Test
    void aNegativePeriodIsRefused() {
        assertThrows(IllegalArgumentException.class, () -> new Throttle(-1, System::nanoTime));
    }
}
