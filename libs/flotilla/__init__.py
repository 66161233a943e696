"""Flotilla: the shared runtime for the agent fleet."""
