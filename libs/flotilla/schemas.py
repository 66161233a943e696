"""``python -m flotilla.schemas``: register every contract in ``schemas/`` with the registry
(``--check``: only ask whether each would be accepted; ``--quiet``: one summary line).

A module of its own, which the package never imports, so that running it does not
re-execute a module the package has already loaded (``flotilla.contracts``).
"""

from flotilla.contracts import main

if __name__ == "__main__":
    main()
