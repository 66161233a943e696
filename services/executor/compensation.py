"""Compensation: what undoes each completed step, in which order, and running it.

A multi-step recovery is a saga. Each completed step is kept with the state the target
reported *before* it ran; undoing a step means driving the resource back to that state:

- scale → scale back to the previous replica count;
- rollback → roll forward to the revision that was running before;
- failover → fail back to the dependency target that was active before;
- pause, a raised ceiling or memory limit → left as they are, said so (undoing them because
  a later step failed would restart a bad rollout or take capacity away); resume → pause;
- restart → nothing to undo (a restart leaves no state behind to restore), said so.

Each kind says how it is undone (``ActionSpec.undo`` in :mod:`flotilla.actions`).

Steps are undone in the reverse of the order they completed, because a later step may
rely on an earlier one (fail back before scaling down the service that absorbed the load).
For the same reason compensation stops at the first undo that fails or cannot be
derived: the steps before it stay as they are and a person takes over. Planning and
:func:`run_plan` do no I/O themselves; the caller passes the function that runs a step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flotilla.actions import CannotUndo
from services.executor.commands import Step, compensation
from services.executor.execution import Applied, Failed, Outcome, Replayed


class CannotCompensate(Exception):
    """The recorded before-state does not say what to go back to."""


@dataclass(frozen=True)
class Completed:
    """A step that was applied, with the target's state around it."""

    step: Step
    before: Mapping[str, Any]
    after: Mapping[str, Any]


@dataclass(frozen=True)
class Undo:
    """How one completed step is undone: a compensating step, or nothing (with why).

    ``impossible`` marks a step whose before-state does not say what to go back to: the
    compensation must stop there and a person must take over.
    """

    completed: Completed
    compensation: Step | None
    note: str
    impossible: bool = False


def undo(done: Completed) -> Undo:
    """The compensation for one completed step (its kind's ``undo``); CannotCompensate if
    its recorded state cannot tell what to go back to."""
    step = done.step
    try:
        reversal = step.spec.undo(step.name, step.params, done.before, done.after)
    except CannotUndo as exc:
        raise CannotCompensate(f"cannot undo {step.action} of {step.name} ({step.idempotency_key}): {exc}") from None
    if reversal.params is None:
        return Undo(done, None, reversal.text)
    return Undo(done, compensation(step, step.action, reversal.params), reversal.text)


def plan(completed: Sequence[Completed]) -> list[Undo]:
    """Undo every completed step, last completed first."""
    undos = []
    for done in reversed(completed):
        try:
            undos.append(undo(done))
        except CannotCompensate as exc:
            undos.append(Undo(done, None, str(exc), impossible=True))
    return undos


@dataclass
class Report:
    """What a compensation run did: ``undone`` in order, ``notes`` per step, and where it stopped."""

    undone: list[tuple[Completed, Applied | Replayed]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stopped_at: Completed | None = None  # the step that could not be undone
    failure: Failed | None = None  # its failed compensation (None: no compensation could be derived)
    reason: str | None = None
    remaining: list[Completed] = field(default_factory=list)  # left as they are, earliest last

    @property
    def complete(self) -> bool:
        return self.stopped_at is None

    @property
    def compensated_command_ids(self) -> list[str]:
        return [done.step.command_id for done, _ in self.undone]

    def summary(self) -> str:
        said = "; ".join(self.notes) if self.notes else "nothing had been changed"
        if self.complete:
            return f"Undid {len(self.undone)} step(s) in reverse order: {said}."
        left = ", ".join(d.step.idempotency_key for d in self.remaining)
        return f"Compensation stopped: {self.reason}. Done so far: {said}. Left as they are: {left or 'none'}."


def run_plan(undos: Sequence[Undo], run: Callable[[Step], Outcome]) -> Report:
    """Run each undo in order, stopping at the first that is impossible or fails."""
    report = Report()
    for index, item in enumerate(undos):
        if item.impossible:
            report.stopped_at, report.reason = item.completed, item.note
        elif item.compensation is None:
            report.notes.append(item.note)
            continue
        else:
            outcome = run(item.compensation)
            if isinstance(outcome, Failed):
                report.stopped_at, report.failure = item.completed, outcome
                report.reason = f"{item.note} failed ({outcome.error_class}: {outcome.message})"
            else:
                report.undone.append((item.completed, outcome))
                report.notes.append(item.note)
                continue
        report.remaining = [u.completed for u in undos[index:]]
        break
    return report
