"""What the screens ask of the app they run in, typed (Textual types ``Screen.app`` as any App).

:class:`~stepwatch.tui.app.StepwatchApp` is the one implementation; a screen annotates
``app: StepwatchAppBase`` (under ``TYPE_CHECKING``) so the checker sees each use, without the
screens importing the app module that imports them.
"""

from __future__ import annotations

from pathlib import Path

from textual.app import App


class StepwatchAppBase(App):
    """The app's attributes and actions that screens use."""

    #: fewer repaints for a slow link (``b`` on the run screen; ``attach --low-bandwidth``)
    low_bandwidth: bool

    def attach(self, run_dir: Path) -> None:
        """Open the run screen on ``run_dir``."""
        raise NotImplementedError
