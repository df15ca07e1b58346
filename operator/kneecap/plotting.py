"""matplotlib for the PNGs of `--plot` and `kneecap demo`: an optional extra (`kneecap run` needs none)."""

from __future__ import annotations

from kneecap.errors import InputError


def pyplot(what: str = "--plot"):
    """matplotlib.pyplot on the file-only Agg backend; InputError naming the extra when it is missing."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise InputError(what, "needs matplotlib: pip install 'kneecap[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
