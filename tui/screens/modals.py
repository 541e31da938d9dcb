"""Modal screens: yes/no confirmation, a one-line prompt, help, and the preflight checklist.

Each is a :class:`Dialog`: its body scrolls inside the box and its keys sit in a row fixed at the box's foot, so at
80x24 (an SSH terminal) a checklist of 40 rows, the help or an alert's whole text scrolls while the keys that act on
it stay on screen."""

from __future__ import annotations

from typing import Any, TypeVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from stepwatch.monitors.snapshot.types import Alert
from stepwatch.tui.format import stack_frames
from stepwatch.tui.safe import one_line, safe_text

HELP = """\
stepwatch keys
  l  launch a run from a config (the preflight checklist comes first)
  r  relaunch this run (confirm; rotates the logs; preflight first)
  x  stop this run (confirm; INT, then TERM, then KILL), or cancel a pending restart
  a  acknowledge the alerts on the banner
  d  every alert's whole text (a long one is cut on the banner)
  i  show / hide the identity line
  b  low-bandwidth mode on / off (log and plots every 5 s; alerts at once)
  u  update the log panel now (low-bandwidth mode)
  h  home: the list of runs
the log (the whole train.log, not only the lines on screen)
  /  search (as typed, any case)      n / N  next / previous match
  e / E  next / previous error or traceback
  F  filter: only the lines holding a text      z  the log full screen (and back)
  g  the loss plot in log scale (and back)
  f / End  follow the tail again (scrolling up stops following; the title says so)
  PageUp / PageDown / Home  scroll the log
  q  quit the app: the run keeps going
  ?  this help                                   (Esc closes)
"""


def key_hints(*pairs: tuple[str, str]) -> Text:
    """`` y  yes (Enter)    n  no (Esc)``: each key in reverse video, which every terminal shows (a
    colour-only focus mark vanished under tmux-256color; a literal ``[y]`` in a Static was read as
    markup and vanished too)."""
    t = Text()
    for key, words in pairs:
        t.append(f" {key} ", "reverse bold")
        t.append(f" {words}    ")
    return t


def key_words(*pairs: tuple[str, str]) -> Text:
    """``Esc closes · PgUp/PgDn scroll``: each key in reverse video, its words right after it (a dialog's foot)."""
    t = Text(" ")
    for i, (key, words) in enumerate(pairs):
        t.append(" · " if i else "")
        t.append(key, "reverse bold")
        t.append(f" {words}")
    return t


ResultT = TypeVar("ResultT")
#: The box's bottom border says so when its body holds more than it shows.
SCROLL_MARK = " PgUp/PgDn scroll "


class DialogBody(VerticalScroll):
    """A dialog's scrolling part (not focusable: the dialog's keys scroll it, an Input keeps the focus). Each time
    its size or its content's changes, the box's bottom border says whether it holds more than it shows."""

    def on_resize(self) -> None:
        frame = self.parent
        if isinstance(frame, Vertical):
            frame.border_subtitle = SCROLL_MARK if self.max_scroll_y > 0 else ""


class Dialog(ModalScreen[ResultT]):
    """A box whose body (``.dialog-body``) scrolls and whose keys (``.dialog-keys``, docked at its foot) are always
    drawn: styles.tcss caps the box at the screen and the body at what the keys leave. PgUp/PgDn/Home/End scroll the
    body whatever has the focus (an Input keeps Home/End for itself)."""

    BINDINGS = [Binding("pagedown", "scroll_body('down')", show=False), Binding("pageup", "scroll_body('up')", show=False),
                Binding("end", "scroll_body('end')", show=False), Binding("home", "scroll_body('home')", show=False),
                Binding("down", "scroll_body('line_down')", show=False),
                Binding("up", "scroll_body('line_up')", show=False)]

    @staticmethod
    def body(id: str | None = None) -> DialogBody:
        return DialogBody(classes="dialog-body", id=id, can_focus=False)

    def action_scroll_body(self, where: str) -> None:
        box = self.query_one(DialogBody)
        {"end": box.scroll_end, "home": box.scroll_home, "down": box.scroll_page_down, "up": box.scroll_page_up,
         "line_down": box.scroll_down, "line_up": box.scroll_up}[where](animate=False)


class Confirm(Dialog[bool]):
    """Ask a yes/no question; ``y``/Enter answers yes, ``n``/Esc no."""

    BINDINGS = [Binding("y,enter", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            with self.body():
                yield Static(safe_text(self.question, newlines=True))
            yield Static(key_hints(("y", "yes (Enter)"), ("n", "no (Esc)")), id="confirm-keys", classes="dialog-keys")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class Choose(Dialog[str | None]):
    """Pick one of a few answers by its key (``r``: from scratch or from a checkpoint); ``n``/Esc cancels."""

    BINDINGS = [Binding("n,escape", "cancel", "cancel")]

    def __init__(self, question: str, choices: list[tuple[str, str]]):
        super().__init__()
        self.question, self.choices = question, choices

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            with self.body():
                yield Static(safe_text(self.question, newlines=True))
            yield Static(key_hints(*self.choices, ("n", "cancel (Esc)")), id="choose-keys", classes="dialog-keys")

    def on_key(self, event: Any) -> None:
        if event.key in {k for k, _ in self.choices}:
            event.stop()
            self.dismiss(event.key)

    def action_cancel(self) -> None:
        self.dismiss(None)


class Prompt(Dialog[str | None]):
    """Ask for one line of text (a config path, an override reason); Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]
    AUTO_FOCUS = "#prompt-input"

    def __init__(self, question: str, value: str = ""):
        super().__init__()
        self.question, self.value = question, value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            with self.body():
                yield Static(safe_text(self.question, newlines=True))
            with Vertical(classes="dialog-keys"):
                yield Input(value=self.value, id="prompt-input")
                yield Static(key_words(("Enter", "done"), ("Esc", "cancels")), id="prompt-keys")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class AlertDetails(Dialog[None]):
    """Every unacknowledged alert, whole (``d`` on the run screen; Esc closes); a text longer than the screen scrolls
    (PgUp/PgDn/space/Home/End, the arrows, the wheel) to its last word, the keys fixed below it."""

    BINDINGS = [Binding("escape,d,q", "close", "close"), Binding("space", "scroll_body('down')", show=False)]

    def __init__(self, alerts: list[Alert]):
        super().__init__()
        self.alerts = alerts

    def compose(self) -> ComposeResult:
        t = Text()
        for a in reversed(self.alerts):  # the newest first, as the banner shows it
            t.append(one_line(f"{a['kind']} ({str(a['at'])[:19].replace('T', ' ')}Z): "), "bold")
            t.append(f"{one_line(a['message'])}\n")  # read from alerts.jsonl: one line, whatever it holds
            if summary := a.get("stacks_summary"):  # every process's stack, grouped: the odd one out first
                t.append("  where the processes stand (py-spy): ", "bold")
                t.append(f"{one_line(summary)}\n")
            if stack := a.get("stack"):  # the supervisor's py-spy dump of the stuck or straggling rank
                frames = stack_frames(stack, most=40)
                t.append("  its Python stack (py-spy, innermost frame first):\n", "bold")
                t.append("".join(f"    {ln}\n" for ln in frames or ["(py-spy printed no frame)"]))
        t.rstrip()  # the keys below say the rest
        with Vertical(classes="dialog", id="alert-dialog"):
            with self.body("alert-details"):
                yield Static(safe_text(t, newlines=True))
            yield Static(key_words(("Esc", "closes"), ("PgUp/PgDn/End", "scroll"), ("a", "(run screen) acknowledges all")),
                         id="alert-keys", classes="dialog-keys")

    def on_mount(self) -> None:
        self.app.clear_notifications()  # a toast says less than this and would cover its end

    def action_close(self) -> None:
        self.dismiss(None)


class Help(Dialog[None]):
    """The key list (it scrolls on a short terminal; its close keys stay on screen)."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "close"), Binding("space", "scroll_body('down')", show=False)]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="help"):
            with self.body():
                yield Static(HELP.rstrip("\n"), id="help-text")
            yield Static(key_words(("Esc", "closes (? and q too)"), ("PgUp/PgDn/Home/End", "scroll")), id="help-keys",
                         classes="dialog-keys")

    def action_close(self) -> None:
        self.dismiss(None)


_MARK = {"pass": ("PASS", "green"), "fail": ("FAIL", "bold red"), "warn": ("WARN", "yellow"), "skipped": ("SKIP", "dim")}


class PreflightScreen(Dialog[dict[str, Any] | None]):
    """Runs the pre-launch checklist in a worker and shows it item by item.

    Dismisses with ``{"checklist": Checklist, "reason": str | None}`` when the operator launches
    (Enter when everything passes; a typed reason when an item failed, recorded like --allow-dirty),
    or None when cancelled.
    """

    BINDINGS = [Binding("escape", "cancel", "cancel"), Binding("enter", "go", "launch")]
    AUTO_FOCUS = None  # the reason input only takes focus when an item failed

    def __init__(self, cfg: Any, title: str):
        super().__init__()
        self.cfg, self.title_text = cfg, title
        self.checklist = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="preflight"):
            with self.body():
                yield Static(safe_text(self.title_text, newlines=True), classes="bold")
                yield Static("running the pre-launch checklist ...", id="pf-items")
            with Vertical(classes="dialog-keys"):  # the keys that act on the checklist: never scrolled away
                yield Static("Esc cancels (the checklist is running)", id="pf-hint")
                yield Input(placeholder="override reason (recorded in run.json)", id="pf-reason")

    def on_mount(self) -> None:
        self.query_one("#pf-reason", Input).display = False
        self._run()

    @work(thread=True, exclusive=True, exit_on_error=False, group="preflight")
    def _run(self) -> None:
        from stepwatch.launcher.preflight import run_checklist  # noqa: PLC0415

        cl = run_checklist(self.cfg)
        self.app.call_from_thread(self._show, cl)

    def _show(self, cl: Any) -> None:
        self.checklist = cl
        t = Text()
        for it in cl.items:
            word, style = _MARK[it.status]
            t.append(f"[{word}] ", style)
            t.append(f"{it.title}: {it.reason}\n")
        t.rstrip()
        self.query_one("#pf-items", Static).update(safe_text(t, newlines=True))
        if cl.failed:
            self.query_one("#pf-hint", Static).update(
                f"{len(cl.failed)} item(s) failed. Type a reason and Enter to launch anyway, Esc to cancel.")
            inp = self.query_one("#pf-reason", Input)
            inp.display = True
            inp.focus()
        else:
            self.query_one("#pf-hint", Static).update("All checks passed. Enter launches, Esc cancels.")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if self.checklist is None:
            return
        if event.value.strip():
            self.dismiss({"checklist": self.checklist, "reason": event.value.strip()})
        elif not self.checklist.failed:
            self.action_go()

    def action_go(self) -> None:
        if self.checklist is not None and not self.checklist.failed:
            self.dismiss({"checklist": self.checklist, "reason": None})

    def action_cancel(self) -> None:
        self.dismiss(None)
