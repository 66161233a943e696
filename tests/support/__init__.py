"""Test helpers shared by the suites: the compose stack starter, fake Kafka messages, an
ordered producer. Not shipped: nothing in libs/ or services/ may import them."""
