"""``python -m asolab``: the ``asolab`` command, for where its script is not on the PATH
(study workers start this way too). It ends as the script does: :func:`asolab.cli.console`."""

from asolab.cli import console

console()
