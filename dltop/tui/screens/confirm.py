"""A yes/no dialog for risky actions; it states exactly what will happen ("evict 41.2 GiB from /data/imagenet")."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from dltop.fmt import human_bytes, plural
from dltop.model.actions import ActionPlan
from dltop.tui.panes.base import plain


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True only on an explicit yes (`y` or the button); Esc, `n` or the other button say no.

    Without a `yes_label` it only informs (a refusal): there is no yes to press, by key or by button."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
    ]
    AUTO_FOCUS = "#confirm-no"  # the safe answer, so Enter does not confirm by accident (also when a key came first)

    def __init__(self, title: str, body: str, yes_label: str | None = "Yes") -> None:
        super().__init__()
        self._title = title
        self._body = body
        self._yes_label = yes_label

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-dialog"):
            yield Static(plain(self._title), id="confirm-title")
            yield Static(plain(self._body), id="confirm-body")
            with Horizontal(id="confirm-buttons"):
                if self._yes_label is not None:
                    yield Button(f"{self._yes_label} (y)", variant="error", id="confirm-yes")
                yield Button("Cancel (n/Esc)" if self._yes_label else "Close (n/Esc)", variant="primary",
                             id="confirm-no")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "answer" and parameters == (True,) and self._yes_label is None)  # a refusal has no yes

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes and self._yes_label is not None)


def plan_dialog(plan: ActionPlan, verb: str | None = None) -> tuple[str, str, str | None]:
    """Title, body and yes label (`verb`, the action's own; None: refused, nothing to confirm) stating what the
    planned action does."""
    size = human_bytes(plan.bytes)
    verb = verb or plan.action.capitalize()
    guard = f"\nMemory guard: {plan.guard}" if plan.guard else ""
    notes = "".join(f"\n{n}" for n in plan.notes)
    if plan.action == "warm":
        return _warm_dialog(plan, f"Read {size} of {plan.target} into the page cache.{guard}{notes}", verb)
    if plan.action == "clear":
        if not plan.allowed:
            return "Clear: refused", plan.guard, None
        body = (f"Delete {size} in {plural(plan.files, 'file')} under {plan.target}. Symlinks are removed, never "
                f"followed.{notes}")
        return f"Clear {size}?", body, verb
    if plan.action == "evict":
        body = (f"Drop {size} of {plan.target} from the page cache (dirty pages are written first).\n"
                f"The next read of these files comes from disk.{notes}")
        return f"Evict {size}?", body, verb
    apparent = f" (apparent size {human_bytes(plan.apparent_bytes)})" if plan.apparent_bytes is not None else ""
    body = (f"mlock {size} of data of {plan.target}{apparent} until you press l again; "
            f"q asks whether to keep it held after dltop.{guard}{notes}")
    if plan.allowed:
        return f"Lock {size}?", body, verb
    # Locked pages really leave memory: a refusal here is final in the TUI (`dltop lock --force` exists for
    # whoever must), never one key away.
    return f"Lock {size}: refused", body, None


def _warm_dialog(plan: ActionPlan, body: str, verb: str) -> tuple[str, str, str | None]:
    """A warm's dialog: all of it, the part that fits in memory, or refused."""
    size = human_bytes(plan.bytes)
    if plan.allowed:
        return f"Warm {size}?", body, verb
    if plan.can_fit:
        body += f"\nYes warms only the part that fits ({human_bytes(plan.fits_bytes)})."
        return f"Warm {human_bytes(plan.fits_bytes)} of {size}?", body, verb
    return f"Warm {size}: refused", body, None


class KeepLocksScreen(ModalScreen[str | None]):
    """q with a lock held: keep it in a detached holder ("keep"), release it ("release"), or stay (None)."""

    BINDINGS = [
        Binding("k", "answer('keep')", "Keep", id="keeplocks.keep"),
        Binding("r", "answer('release')", "Release", id="keeplocks.release"),
        Binding("n,escape", "answer(None)", "Stay", id="keeplocks.stay"),
    ]
    AUTO_FOCUS = "#keeplocks-stay"  # Enter by accident neither quits nor unlocks

    def __init__(self, held: dict[str, int]) -> None:
        super().__init__()
        self._held = held

    def compose(self) -> ComposeResult:
        total = human_bytes(sum(self._held.values()))
        what = "\n".join(f"  {human_bytes(n)}  {t}" for t, n in self._held.items())
        body = (f"Locked in memory now:\n{what}\n"
                "Keep: a small holder process keeps it locked after dltop quits (dltop lock --list shows it, "
                "dltop unlock releases it). Release: unlock it now. Esc: stay in dltop.")
        with Vertical(id="confirm-dialog"):
            yield Static(plain(f"Quit with {total} locked?"), id="confirm-title")
            yield Static(plain(body), id="confirm-body")
            with Horizontal(id="confirm-buttons"):
                yield Button("Keep locked (k)", variant="primary", id="keeplocks-keep")
                yield Button("Release (r)", variant="error", id="keeplocks-release")
                yield Button("Stay (Esc)", id="keeplocks-stay")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss({"keeplocks-keep": "keep", "keeplocks-release": "release"}.get(event.button.id or ""))

    def action_answer(self, choice: str | None) -> None:
        self.dismiss(choice)
