"""Model-based chaos: random scenarios of workflows, limits, operator actions and faults against real workers.

Each test runs one scenario (``tests/faults/model/scenario.py``), drawn from a seed: two or
three ``durq_worker`` processes, keyed jobs sharing keys across queues and job types, rates,
workflows (chains, fan-ins, graphs, dependencies on earlier jobs, more than 500 members),
operator actions (cancel, retry, pause and resume, a ``replace``/``reschedule`` enqueue on a
dedupe key) and faults (``kill -9``, ``SIGSTOP`` past the lease, a renewal blocked behind a row
lock, timeouts, stalls at the race points). The handlers write a ledger row per execution
(``tests.ledger.models.Span``); once the queue is quiet, the checks of ``tests/faults/model``
judge the ledger, the final rows and the actions against the promises of docs/flow-control.md,
docs/workflows.md and docs/runtime.md. A failure names the seed, each broken invariant, its
jobs and its ledger rows, and how to replay the seed:

    DURQ_TEST_DB=postgres DURQ_MODEL_SEED=1234 python -m pytest tests/faults/test_model_chaos.py -k short

The same seed gives the same scenario (its timeline of work, actions and faults); what the
workers do with it depends on timing. ``DURQ_MODEL_HEAVY=1`` replays a seed at the long size.
A few short scenarios run with the suite; ``benchmarks/soak.py --tests`` (or ``--model``) runs
many long ones (``DURQ_MODEL_SEEDS`` of them, from ``DURQ_MODEL_FIRST_SEED``).
``DURQ_MODEL_ARTIFACTS=<folder>`` keeps each scenario's ledger, rows, actions and worker logs
there (otherwise in the test's ``tmp_path``); the failure message names the folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import db_vendor

from .conftest import Faults, one_leg
from .model import history as model_history
from .model import verdict
from .model.driver import Driver
from .model.scenario import generate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

# Short scenarios run by the suite: each mixes every kind of promise, and between them they hold a
# workflow of more than 500 members, a long poll and jobs claimed ahead.
SHORT_SEEDS = [82, 102, 287]
# One seed, or several separated by commas.
REPLAY = [int(seed) for seed in os.environ.get("DURQ_MODEL_SEED", "").split(",") if seed.strip()]


def _soak_seeds() -> list[int]:
    if REPLAY:
        return REPLAY
    # Fixed unless given: every xdist process must collect the same tests.
    first = int(os.environ.get("DURQ_MODEL_FIRST_SEED", "1000"))
    return list(range(first, first + int(os.environ.get("DURQ_MODEL_SEEDS", "12"))))


def run(seed: int, heavy: bool, faults: Faults, tmp_path: Path) -> None:
    """Run the scenario of ``seed`` and judge it; its files go to ``DURQ_MODEL_ARTIFACTS`` when set (the soak's)."""
    keep = os.environ.get("DURQ_MODEL_ARTIFACTS")
    folder = Path(keep) / f"{db_vendor()}-{'heavy' if heavy else 'short'}-{seed}" if keep else tmp_path / "model"
    scenario = generate(seed, heavy=heavy)
    record = Driver(scenario, faults.spawn, db_vendor()).run(quiet_cap_s=180 if heavy else 60)
    history = model_history.load(scenario, record)
    violations = verdict.judge(history)
    verdict.save(history, violations, folder)
    replay = (
        f"DURQ_TEST_DB={db_vendor()} DURQ_MODEL_SEED={seed}{' DURQ_MODEL_HEAVY=1' if heavy else ''}"
        " python -m pytest tests/faults/test_model_chaos.py -k short"
    )
    assert not violations, verdict.explain(history, violations, db_vendor(), replay, folder)


@one_leg
@pytest.mark.parametrize("seed", REPLAY or SHORT_SEEDS)
def test_short_scenario_keeps_every_promise(seed: int, faults: Faults, tmp_path: Path) -> None:
    run(seed, os.environ.get("DURQ_MODEL_HEAVY") == "1", faults, tmp_path)


@pytest.mark.heavy
@pytest.mark.parametrize("seed", _soak_seeds())
def test_heavy_scenario_keeps_every_promise(seed: int, faults: Faults, tmp_path: Path) -> None:
    run(seed, True, faults, tmp_path)
