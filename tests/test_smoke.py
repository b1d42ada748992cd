import pytest

from django_durq.clock import ManualClock, use_clock
from django_durq.models import Job
from django_durq.testing import drain
from tests.ledger import jobs
from tests.ledger.models import Effect


@pytest.mark.django_db(transaction=True)
def test_enqueue_and_drain():
    clock = ManualClock()
    with use_clock(clock):
        job = jobs.effect.enqueue(tag="a")
        assert job.pk and job.status == "waiting"
        outcomes = drain(clock=clock)
    assert outcomes == {"finished": 1}
    assert Effect.objects.get().tag == "a"
    assert not Job.objects.exists()


def test_worker_process_drains(spawn_worker):
    jobs.effect.enqueue_many([{"tag": str(i)} for i in range(200)])
    worker = spawn_worker("--burst", "--queue", "default:4")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert Effect.objects.count() == 200
    assert not Job.objects.exists()
    assert "exclusive across" in worker.output()
