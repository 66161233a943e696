"""``python -m flotilla.registrar``: the registry's registrar, for deployments' init jobs.

``users --credentials FILE --users FILE`` makes the registrar's ``user:password`` once (or
takes ``$FLOTILLA_SCHEMA_REGISTRY_AUTH``) and writes the registry's users file from it;
``compatibility LEVEL`` sets the registry's global compatibility rule as the registrar.
See ``flotilla.registry``. A module of its own, which the package never imports, so that
running it does not re-execute a module the package has already loaded.
"""

import sys

from flotilla.registry import main

if __name__ == "__main__":
    sys.exit(main())
