"""One error family for everything a user can get wrong.

`FolnetError` subclasses `ValueError`, so callers that already catch `ValueError` keep working,
while code that wants to tell folnet's own complaints apart can catch `FolnetError`. Messages
quote the offending input, say what was expected and, where there is a closed set of choices,
list them.

`NonFiniteError` is the one subclass with its own exit status: a run that diverged (NaN or inf
in its loss, gradients or weights) is not a mistyped option but a failed run, so the command
line exits 1 for it, where it exits 2 for every other `FolnetError`; scripts and schedulers can
tell "fix the command" from "the training blew up". `Interrupted` (Ctrl-C) exits 130.
"""

from __future__ import annotations

from collections.abc import Iterable


class FolnetError(ValueError):
    """A user-facing error: bad spec, bad architecture string, bad tensor, bad option."""


class NonFiniteError(FolnetError):
    """A training run stopped because its loss, gradients or weights were not finite."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C reached a run: a `KeyboardInterrupt` (code that stops on one still does) whose
    message says where the run stopped and what to run to go on; the command line prints it as
    one line and exits 130 (128 + SIGINT), as shells do for an interrupted program."""


def choices(values: Iterable[object]) -> str:
    """Render a closed set of valid choices for an error message: ``'a', 'b' or 'c'``."""
    items = [repr(v) for v in values]
    if not items:
        return "(none)"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " or " + items[-1]
