"""The Flotilla fleet: one package per service, each only its handlers on ``flotilla``."""
