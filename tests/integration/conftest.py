"""Integration tests use the session stack fixtures of tests/stack_fixtures.py."""
