"""``python -m flotilla_eval``: what ``flotilla eval`` runs."""

from flotilla_eval.cli import main

main()
