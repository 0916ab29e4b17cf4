"""Where the dashboard's charting library comes from: `plotly.min.js` inside the installed PyPI `plotly` package.

Served by the server itself (`/dashboard/plotly.min.js`), never from a CDN, so the dashboard works on a closed
network and its version is the one pinned in pyproject. Found without importing plotly (its import is slow and
pulls in narwhals); plotly has shipped the file under `package_data/` since 4.x.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PLOTLY_JS = Path("package_data") / "plotly.min.js"


class PlotlyMissingError(RuntimeError):
    pass


def plotly_js_path() -> Path:
    """The absolute path of the installed `plotly.min.js`; PlotlyMissingError with the fix if it is not there."""
    try:
        spec = importlib.util.find_spec("plotly")
    except (ImportError, ValueError) as e:
        raise PlotlyMissingError(f"cannot locate the plotly package: {e}; pip install 'plotly>=5'") from e
    if spec is None or not spec.submodule_search_locations:
        raise PlotlyMissingError("the plotly package is not installed; the dashboard charts need its plotly.min.js "
                                 "(pip install 'plotly>=5', a loraplex dependency)")
    for root in spec.submodule_search_locations:
        path = Path(root) / PLOTLY_JS
        if path.is_file():
            return path.resolve()
    raise PlotlyMissingError(f"plotly is installed at {list(spec.submodule_search_locations)} but has no "
                             f"{PLOTLY_JS.as_posix()}; reinstall it (pip install --force-reinstall 'plotly>=5')")
