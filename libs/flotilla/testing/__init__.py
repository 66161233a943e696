"""Test helpers shared by the Flotilla test suites (nothing here runs in production)."""
